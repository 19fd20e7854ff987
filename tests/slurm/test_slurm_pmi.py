"""Why jobs/train.sbatch starts the venv's MPICH with its own mpiexec, not srun.

pip's MPICH speaks PMI-1 to srun (it has no PMI-2 client), and Slurm's pmi2 plugin reads
a PMI-1 request with one read of at most 1024 bytes. MPICH's start-up puts (segments of
its address table: values of up to 1024 bytes plus a 60-byte header) then now and then
arrive cut: slurmstepd logs
"value not properly terminated in client request" and "request not begin with 'cmd='",
and MPI_Init dies or hangs. This test speaks the PMI-1 wire itself on a task's PMI_FD: a
put of 1001 bytes is answered, one of 1101 bytes is cut. Should a Slurm answer the long
one whole, srun is safe for that MPICH again and train.sbatch's rule can go.
"""

from __future__ import annotations

import subprocess
import sys

CLIENT = r"""
import os, socket, sys
s = socket.socket(fileno=int(os.environ["PMI_FD"]))
s.settimeout(10)
def ask(m):
    s.sendall(m.encode())
    return s.recv(65536).decode()
assert ask("cmd=init pmi_version=1 pmi_subversion=1\n").startswith("cmd=response_to_init rc=0")
kvs = ask("cmd=get_my_kvsname\n").split("kvsname=")[1].strip()
for total in (1001, 1101):
    head = f"cmd=put kvsname={kvs} key=k{total} value="
    print(total, ask(head + "A" * (total - len(head) - 1) + "\n").strip(), flush=True)
"""


def test_slurms_pmi2_plugin_cuts_a_pmi1_request_over_1024_bytes(slurm):
    r = subprocess.run(["srun", "--mpi=pmi2", "-n", "1", "-t", "1", sys.executable, "-c", CLIENT],
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "1001 cmd=put_result rc=0" in out, out  # whole: answered
    assert "mpi/pmi2: value not properly terminated in client request" in out, out  # 1101: cut at 1024
    assert "mpi/pmi2: request not begin with 'cmd='" in out, out  # and its tail read as a request
