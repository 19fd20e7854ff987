"""failure.batch = "scale": the sampler whose global batch changes at a step
(hpcdp.data.rescale): the steps before it keep their samples, the rest of that epoch is
re-split at the new batch (no sample twice, none skipped but the rest shorter than a
batch with last_batch = "drop"), the next epochs start from their first sample, the
step count for train.epochs follows, and the schedule a checkpoint records rebuilds it."""

import numpy as np
import pytest

from hpcdp.data.rescale import from_schedule, parse_schedule, rescaled, schedule
from hpcdp.data.sampler import GlobalSampler, WindowSampler


def _epoch(sampler, epoch, first=0):
    """The global batches of ``epoch``, in step order (from step ``first``)."""
    out, step = [], first
    while sampler.start(step)[0] <= epoch:
        if sampler.start(step)[0] == epoch:
            out.append(sampler.global_indices(step))
        step += 1
    return out


@pytest.mark.parametrize("last_batch", ["drop", "keep"])
def test_the_rest_of_the_epoch_is_re_split_at_the_new_batch(last_batch):
    base = GlobalSampler(512, 30, 7, last_batch)
    s = rescaled(base, 4, 20)  # 0-based step 4 (the 5th) on: 20 samples
    for step in range(4):
        assert np.array_equal(s.global_indices(step), base.global_indices(step))
    assert np.array_equal(s.global_indices(4), base.permutation(0)[120:140])  # where step 4 began
    batches = _epoch(s, 0)
    taken = np.concatenate(batches)
    assert len(set(taken.tolist())) == len(taken)  # no sample twice
    # 120 samples at 30, then 392 left: 19 of 20 and a rest of 12 (dropped, or the short last batch)
    assert [len(b) for b in batches] == [30] * 4 + [20] * 19 + ([12] if last_batch == "keep" else [])
    assert np.array_equal(np.sort(taken), np.arange(512)) == (last_batch == "keep")
    first1 = len(batches)
    assert s.start(first1) == (1, 0) and np.array_equal(s.global_indices(first1), base.permutation(1)[:20])
    per_epoch = 25 + (last_batch == "keep")  # 512 // 20 (+ the short one)
    assert s.batches_per_epoch == per_epoch
    assert s.steps_for_epochs(3) == first1 + 2 * per_epoch
    assert s.steps_for_epochs(1) == first1
    assert s.global_batch == 20 and s.local_indices(first1, 2, 1)[1] == 20


def test_a_rest_shorter_than_the_new_batch_is_dropped_and_the_next_epoch_starts():
    base = GlobalSampler(100, 30, 1, "drop")  # 3 steps of 30, 10 dropped
    s = rescaled(base, 2, 40)  # 40 samples left from step 2: one batch of 40
    assert s.start(2) == (0, 60) and len(s.global_indices(2)) == 40
    assert s.start(3) == (1, 0)
    t = rescaled(base, 2, 50)  # 40 left < 50: the epoch ends there
    assert t.start(2) == (1, 0) and np.array_equal(t.global_indices(2), base.permutation(1)[:50])


def test_changes_chain_and_the_schedule_rebuilds_the_sampler():
    base = GlobalSampler(512, 30, 3, "drop")
    s = rescaled(rescaled(base, 4, 20), 30, 10)
    assert schedule(s) == [[0, 30], [4, 20], [30, 10]]
    assert rescaled(s, 40, 10) is s  # no change
    again = from_schedule(GlobalSampler(512, 64, 3, "drop"), parse_schedule('[[0, 30], [4, 20], [30, 10]]'))
    for step in (0, 3, 4, 29, 30, 31, 80):
        assert np.array_equal(again.global_indices(step), s.global_indices(step)), step
        assert again.start(step) == s.start(step)
    assert schedule(base) == [[0, 30]]


@pytest.mark.parametrize("text", ["[]", "[[1, 30]]", "[[0, 30], [0, 20]]", "[[0, 0]]", '[[0, "30"]]', "{}"])
def test_a_damaged_schedule_is_refused(text):
    with pytest.raises(ValueError, match="batch_schedule"):
        parse_schedule(text)


def test_token_windows_draw_the_first_windows_of_each_step():
    base = WindowSampler(1000, 30, 5, 8)
    s = rescaled(base, 3, 20)
    assert np.array_equal(s.global_indices(2), base.global_indices(2))
    assert np.array_equal(s.global_indices(6), base.global_indices(6)[:20])
    assert s.steps_for_epochs(2) > base.steps_for_epochs(2)  # smaller batches: more steps per epoch
