"""The ring's one schedule (hpcdp.comm.schedules.ring), which the Python ring and the
compiled ring both run: its steps agree between neighbours, every chunk ends where the
algorithm says, and every receive is either open at the start, gated by the step two
back, or waits for the send that reads its chunk."""

from __future__ import annotations

import pytest

from hpcdp.comm.schedules.ring import COPY, REDUCE, ring_schedule
from hpcdp.shard import shard_bounds

BOTH = ("rs", "ag")


@pytest.mark.parametrize("N", [2, 3, 4, 7])
@pytest.mark.parametrize("n", [1, 5, 64, 1001])
def test_neighbours_agree_and_each_rank_ends_with_its_chunk(N, n):
    scheds = [ring_schedule(n, N, r, 7, BOTH, False) for r in range(N)]
    for r, s in enumerate(scheds):
        assert s.bounds == tuple(shard_bounds(n, N)) and len(s.steps) == 2 * (N - 1)
        right = scheds[(r + 1) % N]
        for t, (send, recv, kind) in enumerate(s.steps):
            assert right.steps[t][1] == send and right.steps[t][2] == kind  # what r sends, r+1 receives
            if t + 1 < len(s.steps) and s.steps[t + 1][2] == kind:
                assert s.steps[t + 1][0] == recv  # a received chunk is forwarded next step
        rs = [st for st in s.steps if st[2] == REDUCE]
        ag = [st for st in s.steps if st[2] == COPY]
        assert rs[-1][1] == r  # after the reduce-scatter rank r owns chunk r
        assert ag[0][0] == r  # and sends it first in the all-gather
        assert sorted(c for _, c, _ in ag) == sorted(set(range(N)) - {r})  # receives every other chunk
        assert s.left_recv == sum(s.nseg[c] for _, c, _ in s.steps)
        assert (s.left, s.right) == ((r - 1) % N, (r + 1) % N)


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("N", [2, 3, 5])
def test_every_receive_is_open_gated_two_steps_back_or_waits_for_its_send(N, separate):
    s = ring_schedule(1000, N, 1 % N, 64, BOTH, separate)
    opened = set(s.open_recvs)
    waiting = {t_k for t_k in ((t, k) for (_, k), t in s.copy_after)}
    assert not opened & waiting
    for t, (_, rc, kind) in enumerate(s.steps):
        for k in range(s.nseg[rc]):
            if (t, k) in opened or (t, k) in waiting:
                continue
            # the rest: reduce-scatter receives let in when segment k of step t-2 is reduced
            assert kind == REDUCE and t >= 2 and k < s.nseg[s.steps[t - 2][1]], (t, k)
    for (ts, k), t in s.copy_after:  # an all-gather receive waits for the send reading its chunk
        assert s.steps[t][2] == COPY and s.steps[ts][2] == REDUCE and s.steps[ts][0] == s.steps[t][1]
        assert not (separate and ts == 0)  # a first send out of a separate source reads no work chunk


def test_one_phase_and_the_schedule_is_shared():
    rs = ring_schedule(100, 4, 2, 10, ("rs",), False)
    ag = ring_schedule(100, 4, 2, 10, ("ag",), False)
    assert [k for _, _, k in rs.steps] == [REDUCE] * 3 and rs.last_rs == 2
    assert [k for _, _, k in ag.steps] == [COPY] * 3 and ag.last_rs == -1 and not ag.copy_after
    assert ring_schedule(100, 4, 2, 10, ("rs",), False) is rs  # one object per shape
