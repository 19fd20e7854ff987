"""``hpcdp bench data``: the on-disk loader's read throughput, and how long training waits for data.

Part 1, reads (one process; every contender reads the same samples in the same
round, rounds interleaved, median of ``--rounds``):

- rows: batches of random samples (the sampler's order) of an HDF5 file, read by
  hpcdp's view (``ds.x_train[idx]``: sorted, coalesced, sieved ``pread``s, rows put
  back in the sampler's order), by plain h5py (``dset[np.sort(idx)]``, sorted: h5py
  needs increasing indices, and the reorder is not charged to it) and by NumPy
  (``np.load(mmap_mode="r")[idx]`` on a ``.npy`` copy of the same array, mapped per
  batch so that its resident pages do not pile up over the run);
- windows: batches of random windows of ``T + 1`` tokens of the stdlib corpus, read by
  hpcdp (``Windows.pairs``), by nanoGPT's pattern (a fresh ``np.memmap`` of the raw
  tokens each batch, ``np.stack([m[i:i + T + 1] for i in ix])``) and by h5py slices.

Sizes: digits-sized rows (1797 x 64 float32, batch 64), larger rows (``--rows`` x 1024
float32, batch 256) and the corpus (``hpcdp data prepare --python-stdlib``, batch 32,
T = 128). Files are written to a temporary folder and removed; the page cache is warm
(just written) unless ``--cold``, which evicts each file (``posix_fadvise DONTNEED``)
before every batch of every contender.

Part 2, waiting (``--ranks 1,2``): ``hpcdp train`` runs with ``data.prefetch`` true and
false on the digits-sized rows (MLP 64-128-10) and on the corpus (the
jobs/gpt_pysource.toml model, ``--gpt-steps`` steps); from metrics.jsonl, steps 2..:
each rank's ``sum(data_wait_s) / sum(step_time_s)`` averaged over ranks ("wait/step",
sensitive to a few long waits on a loaded machine), the median wait over the
median step time ("median"), and the median and 90th percentile wait in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpcdp.jobs import config_path

import numpy as np



def _evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _time_rounds(contenders: dict, batches: list, rounds: int, cold_files) -> dict:
    """Median seconds per batch of each contender; contenders interleaved within each round."""
    times = {name: [] for name in contenders}
    for r in range(rounds):
        for name, fn in contenders.items():
            fn(batches[0])  # warm the code path (not the data: --cold evicts below)
            t = 0.0
            for idx in batches:
                for p in cold_files:
                    _evict(p)
                t0 = time.perf_counter()
                fn(idx)
                t += time.perf_counter() - t0
            times[name].append(t / len(batches))
    return {name: float(np.median(v)) for name, v in times.items()}


def _rows_case(folder: Path, n: int, d: int, batch: int, args) -> dict:
    import h5py

    from hpcdp.config import DataConfig
    from hpcdp.data import load_dataset
    from hpcdp.data.sampler import GlobalSampler

    rng = np.random.default_rng(0)
    x = rng.random((n, d), dtype=np.float32)
    h5, npy = folder / f"rows{n}.h5", folder / f"rows{n}.npy"
    with h5py.File(h5, "w") as f:
        f["x"], f["y"] = x, np.arange(n) % 10
    np.save(npy, x)
    del x
    ds = load_dataset(DataConfig(kind="hdf5", path=str(h5), test_fraction=0.0, seed=0), "classification")
    s = GlobalSampler(n, batch, seed=1)
    batches = [s.global_indices(k) for k in range(min(args.batches, s.batches_per_epoch))]
    f = h5py.File(h5, "r")
    dset = f["x"]
    contenders = {
        "hpcdp": lambda idx: ds.x_train[idx],
        "h5py": lambda idx: dset[np.sort(idx)],
        "numpy memmap": lambda idx: np.load(npy, mmap_mode="r")[idx],
    }
    for idx in batches[:3]:  # the same bytes (h5py's in sorted order)
        got = contenders["hpcdp"](idx)
        assert np.array_equal(got[np.argsort(idx)], contenders["h5py"](idx))
        assert np.array_equal(got, contenders["numpy memmap"](idx))
    t = _time_rounds(contenders, batches, args.rounds, [h5, npy] if args.cold else [])
    f.close()
    return {"case": f"rows {n} x {d} float32", "batch": batch, "sample_bytes": d * 4,
            "method": ds.x_train.array.method, "seconds": t}


def _windows_case(folder: Path, batch: int, T: int, args) -> dict:
    import h5py

    from hpcdp.config import DataConfig
    from hpcdp.data import load_dataset
    from hpcdp.data.prepare import collect_files, prepare_corpus, stdlib_dir
    from hpcdp.data.sampler import WindowSampler

    corpus = folder / "pysource.h5"
    prepare_corpus(collect_files([stdlib_dir()], "*.py", ["site-packages", "dist-packages"]), corpus)
    ds = load_dataset(DataConfig(kind="tokens", path=str(corpus)), "sequence", block_size=T)
    windows = ds.x_train.windows
    raw = folder / "train.bin"
    dset_file = h5py.File(corpus, "r")
    dset = dset_file["train/tokens"]
    dset[()].tofile(raw)  # nanoGPT's format: the raw uint8 ids
    s = WindowSampler(ds.n_train, batch, 1, T)
    batches = [s.global_indices(k) for k in range(args.batches)]

    def nanogpt(ix):
        m = np.memmap(raw, dtype=np.uint8, mode="r")  # recreated each batch, as nanoGPT does
        w = np.stack([m[i:i + T + 1] for i in ix]).astype(np.int64)
        return w[:, :-1], w[:, 1:]

    def h5py_slices(ix):
        w = np.stack([dset[i:i + T + 1] for i in ix]).astype(np.int64)
        return w[:, :-1], w[:, 1:]

    contenders = {"hpcdp": windows.pairs, "nanoGPT memmap": nanogpt, "h5py": h5py_slices}
    assert all(np.array_equal(contenders["hpcdp"](batches[0])[0], fn(batches[0])[0]) for fn in contenders.values())
    t = _time_rounds(contenders, batches, args.rounds, [corpus, raw] if args.cold else [])
    dset_file.close()
    return {"case": f"windows of {T + 1} tokens, corpus {ds.info['train_tokens']:,} tokens", "batch": batch,
            "sample_bytes": T + 1, "method": windows.tokens.method, "seconds": t}


def _wait_fraction(folder: Path, job: list[str], ranks: int, prefetch: bool, name: str) -> dict:
    from hpcdp.launch import child_env, hpcdp_command, mpiexec_command

    out = folder / f"{name}-n{ranks}-{'pf' if prefetch else 'nopf'}"
    cmd = [*hpcdp_command(), "train", *job, "--set", f'run.out_dir="{out}"',
           "--set", f"data.prefetch={'true' if prefetch else 'false'}", "--set", "run.log_every=100000"]
    if ranks > 1:
        cmd = mpiexec_command(ranks, "hpcdp bench data") + cmd
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    # step records with every rank's lists (above run.rank_lists_up_to ranks: every K steps)
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if r.get("step", 0) > 1 and "ranks" in r]
    wait = np.array([s["ranks"]["data_wait_s"] for s in steps])      # (steps, ranks)
    step = np.array([s["ranks"]["step_time_s"] for s in steps])
    return {"case": name, "ranks": ranks, "prefetch": prefetch, "steps": len(steps) + 1,
            "wait_fraction": float(np.mean(wait.sum(0) / step.sum(0))),
            "wait_fraction_median": float(np.median(wait) / np.median(step)),
            "wait_ms_median": 1e3 * float(np.median(wait)), "wait_ms_p90": 1e3 * float(np.percentile(wait, 90)),
            "step_ms_median": 1e3 * float(np.median(step))}


def _parser():
    p = argparse.ArgumentParser(prog="hpcdp bench data", description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=32768, help="samples of the larger rows case (x 4 KiB)")
    p.add_argument("--batches", type=int, default=50, help="batches per contender per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cold", action="store_true", help="evict the files from the page cache before each batch")
    p.add_argument("--ranks", default="1,2", help="rank counts of part 2 ('' skips part 2)")
    p.add_argument("--gpt-steps", type=int, default=40, help="steps of the corpus training runs")
    p.add_argument("--digits-steps", type=int, default=300, help="steps of the digits-sized training runs")
    p.add_argument("--skip-reads", action="store_true", help="only part 2")
    p.add_argument("--json", help="write the results here")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="hpcdp-bench-data-"))
    result = {"env": {"python": platform.python_version(), "numpy": np.__version__,
                      "load_start": os.getloadavg(), "cold": args.cold}, "reads": [], "waits": []}
    try:
        if not args.skip_reads:
            for case in (lambda: _rows_case(folder, 1797, 64, 64, args),
                         lambda: _rows_case(folder, args.rows, 1024, 256, args),
                         lambda: _windows_case(folder, 32, 128, args)):
                r = case()
                result["reads"].append(r)
                base = r["seconds"]["hpcdp"]
                print(f"\n{r['case']}, batch {r['batch']} ({r['method']}; {'cold' if args.cold else 'warm'} cache)")
                print(f"  {'reader':<16}{'ms/batch':>10}{'samples/s':>14}{'MB/s':>10}{'time / hpcdp':>14}")
                for name, sec in r["seconds"].items():
                    print(f"  {name:<16}{1e3 * sec:>10.3f}{r['batch'] / sec:>14,.0f}"
                          f"{r['batch'] * r['sample_bytes'] / sec / 1e6:>10,.1f}{sec / base:>13.2f}x", flush=True)
        ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
        if ranks:
            digits = folder / "digits.h5"
            _digits_file(digits)
            corpus = folder / "pysource.h5"
            if not corpus.exists():
                from hpcdp.data.prepare import collect_files, prepare_corpus, stdlib_dir
                prepare_corpus(collect_files([stdlib_dir()], "*.py", ["site-packages", "dist-packages"]), corpus)
            jobs = {"digits-sized (MLP)": ["--set", "data.kind=hdf5", "--set", f'data.path="{digits}"',
                                           "--set", f"train.steps={args.digits_steps}",
                                           "--set", "parallel.strategy=ddp"],
                    "corpus (GPT)": ["--config", str(config_path("gpt_pysource.toml")),
                                     "--set", f'data.path="{corpus}"', "--set", f"train.steps={args.gpt_steps}",
                                     "--set", "sample.length=0", "--set", "run.eval_every=0",
                                     "--set", "data.eval_windows=16"]}
            print(f"\n{'case':<20}{'ranks':>6}{'prefetch':>9}{'wait/step':>11}{'median':>9}"
                  f"{'wait ms':>9}{'p90':>8}{'step ms':>9}")
            for name, job in jobs.items():
                for n in ranks:
                    for pf in (False, True):
                        w = _wait_fraction(folder, job, n, pf, name.split()[0])
                        w["case"] = name
                        result["waits"].append(w)
                        print(f"{name:<20}{n:>6}{str(pf):>9}{100 * w['wait_fraction']:>10.2f}%"
                              f"{100 * w['wait_fraction_median']:>8.2f}%{w['wait_ms_median']:>9.3f}"
                              f"{w['wait_ms_p90']:>8.3f}{w['step_ms_median']:>9.2f}", flush=True)
        result["env"]["load_end"] = os.getloadavg()
        loads = {k: " / ".join(f"{x:.2f}" for x in result["env"][k]) for k in ("load_start", "load_end")}
        print(f"\nload average (1 / 5 / 15 min): start {loads['load_start']}, end {loads['load_end']}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def _digits_file(path: Path) -> None:
    """The 8x8 digits (shipped with hpcdp) as an HDF5 file."""
    import h5py

    from hpcdp.data.digits import digits_file, read_digits

    pixels, labels = read_digits(digits_file())
    x, y = (pixels / 16.0).astype(np.float32), labels
    with h5py.File(path, "w") as f:
        f["x"], f["y"] = x, y


if __name__ == "__main__":
    sys.exit(main())
