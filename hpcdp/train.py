"""The training loop and nothing else: wires data, model, strategy, optimizer, metrics.

One optimizer step is :func:`hpcdp.step.train_step` (the strategy's moments, the
loss weighting and the empty-slice rule live there)::

    strategy.setup(flat, optimizer, world)
    for each step:
        batch = this rank's slice of the global batch, cut into micro-batches
        train_step(model, strategy, batch, fetch); metrics <- strategy.step_stats()
    strategy.close()

Every rank takes its slice of the same global batch (the global sampler); the
evaluation splits the test set by the shard rule and every worker runs the same
number of forward passes (a sharded strategy communicates inside forward).
"""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path

import numpy as np

from hpcdp.config import Config, dump_toml
from hpcdp.config_error import ConfigError
from hpcdp.data import Dataset, load_dataset
from hpcdp.data.batches import BatchSource, read_pairs
from hpcdp.data.rescale import rescaled
from hpcdp.failure.lasting import Lasting
from hpcdp.failure.policy import step_of
from hpcdp.exact.digest import weights_sha256
from hpcdp.generate import sample_at_end
from hpcdp.io.checkpointer import Checkpointer
from hpcdp.metrics import FirstStepNotice, MetricsWriter, StepGather
from hpcdp.optim import build_optimizer, lr_at
from hpcdp.rundir import new_run_dir
from hpcdp.shard import shard_range
from hpcdp.step import train_step
from hpcdp.strategies import build_strategy as default_build_strategy


def task_of(model_cfg) -> str:
    """The dataset task a model trains on: "classification" (MLP) or "sequence" (GPT);
    public for the tools that load a config's data themselves (bench exact, ps study)."""
    return "classification" if model_cfg.kind == "mlp" else "sequence"


def check_model_fits_data(model_cfg, ds: Dataset) -> None:
    """Errors that name the model key to change when model and data disagree."""
    if model_cfg.kind == "mlp":
        n_in, n_out = ds.x_train.shape[1], model_cfg.sizes[-1]
        if model_cfg.sizes[0] != n_in:
            raise ConfigError(f"model.sizes: the first size must be the number of input features of "
                              f"{ds.name} ({n_in}), found {model_cfg.sizes[0]}")
        if n_out != ds.n_classes:
            raise ConfigError(f"model.sizes: the last size must be the number of classes of "
                              f"{ds.name} ({ds.n_classes}), found {n_out}")
    else:
        if model_cfg.vocab_size < ds.n_classes:
            raise ConfigError(f"model.vocab_size: {ds.name} uses token ids up to {ds.n_classes - 1}; "
                              f"needs >= {ds.n_classes}, found {model_cfg.vocab_size}")
        if model_cfg.block_size < ds.x_train.shape[1]:
            raise ConfigError(f"model.block_size: {ds.name} sequences have {ds.x_train.shape[1]} tokens; "
                              f"needs >= {ds.x_train.shape[1]}, found {model_cfg.block_size}")


def evaluate(model, ds: Dataset, batch: int, dp_rank: int, dp_size: int, comm, backend,
             timeout: float | None = None, ignore_index=None) -> dict:
    """Test loss and accuracy; workers split the test set (shard rule) and sum.
    Positions whose target is ``ignore_index`` (padding) are not counted.

    Every worker runs the same number of forward passes (computed from the largest
    piece) so strategies that communicate inside forward stay in step.
    """
    from hpcdp.autograd import Tensor, no_grad

    n = ds.n_test
    off, size = shard_range(n, dp_size, dp_rank)
    n_batches = math.ceil(shard_range(n, dp_size, 0)[1] / batch)
    sums = np.zeros(3)  # loss sum, correct, count (tokens for sequences)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with no_grad():
            for b in range(n_batches):
                lo, hi = off + min(b * batch, size), off + min((b + 1) * batch, size)
                if hi == lo:
                    # This piece is shorter: run one sample and drop it, so a strategy
                    # that gathers parameters inside forward meets every other rank.
                    model(Tensor(ds.x_test[:1], backend=backend))
                    continue
                logits = model(Tensor(ds.x_test[lo:hi], backend=backend)).numpy().astype(np.float64)
                y = ds.y_test[lo:hi]
                logits = logits.reshape(-1, logits.shape[-1])
                y = y.reshape(-1)
                if ignore_index is not None:
                    keep = y != ignore_index
                    logits, y = logits[keep], y[keep]
                mx = logits.max(axis=1, keepdims=True)
                lse = mx[:, 0] + np.log(np.exp(logits - mx).sum(axis=1))
                sums += (float((lse - logits[np.arange(len(y)), y]).sum()),
                         float((logits.argmax(axis=1) == y).sum()), len(y))
    finally:
        if hasattr(model, "train"):
            model.train()
    if comm is not None and comm.Get_size() > 1:
        from hpcdp.comm import allreduce
        allreduce(sums, comm=comm, op="sum", timeout=timeout)  # sum over workers (deadline: timeout)
    count = max(sums[2], 1.0)
    return {"loss": sums[0] / count, "accuracy": sums[1] / count, "n": int(sums[2])}


def run_training(cfg: Config, *, world=None, model=None, out=None, resume=None,
                 build_strategy=None) -> dict:
    """Train as ``cfg`` says. ``model`` overrides ``hpcdp.nn.build_model`` (tests);
    ``resume``: a checkpoint to continue from (``--resume``: a path or "latest");
    ``build_strategy(parallel_cfg, world, comm_cfg)``: the strategy factory (default
    hpcdp.strategies.build_strategy; a benchmark passes its own, e.g. a compute-only one).

    Returns a summary dict (run_dir, steps, last loss, last eval) on every worker.
    """
    held: list = []  # the checkpoint folder's writer lock, once taken (rank 0)
    try:
        return _run_training(cfg, world, model, out, resume, build_strategy, held)
    finally:
        for lock in held:
            lock.release()


def before_anything(cfg: Config, resume, held: list) -> None:
    """World rank 0, first of all (no data read, no run directory made): the
    ``--resume`` target must name a complete checkpoint, and a job that saves into
    an explicit ``checkpoint.dir`` takes its writer lock (hpcdp/io/lock.py) and finds
    no other training run's checkpoints there."""
    path = None
    if resume:
        from hpcdp.io.format.commit import resolve
        path = resolve(resume, cfg.checkpoint.dir or None)
    if cfg.checkpoint.enabled and cfg.checkpoint.dir:
        from hpcdp.io.checkpointer import check_folder
        from hpcdp.io.format.commit import lineage_of
        from hpcdp.io.lock import acquire
        held.append(acquire(cfg.checkpoint.dir, cfg.run.name))
        # a fresh job: no training run's checkpoints may be there; a resumed one: its own only
        check_folder(cfg.checkpoint.dir, lineage_of(path) if path else "(a new training run)")


def _run_training(cfg: Config, world, model, out, resume, build_strategy, held: list) -> dict:
    from hpcdp.autograd import Tensor
    from hpcdp.backend import get_backend
    from hpcdp.failure.agreement import on_root, stage
    from hpcdp.failure.skew import schedule_differences, schedule_text
    from hpcdp.failure.steps import StepChecks, release
    from hpcdp.nn.padding import slice_weight

    ignore = cfg.model.ignore if cfg.model.kind == "gpt" else None
    if world is None:
        from hpcdp.world import World
        world = World.from_mpi(device=cfg.run.device)
    # The memory figures count what this process holds: free an earlier in-process
    # run's cyclic garbage first (one collection per run, milliseconds).
    gc.collect()
    # The [comm] section steers every collective from here on (an environment variable
    # that overrides one of its values is logged once: hpcdp.comm.core.settings).
    from hpcdp.comm import configure
    configure(cfg.comm)
    # Each setup stage ends with every rank agreeing (hpcdp.failure.agreement): an error on
    # any rank (config, data, memory...) raises the same JobError on every rank.
    setup_s = cfg.comm.setup_timeout
    with stage(world.comm, "setup", timeout=setup_s):
        if world.rank == 0:
            before_anything(cfg, resume, held)
        try:
            if cfg.run.device == "cuda":  # one GPU per rank on a node: GPU = local rank % GPUs
                from hpcdp.backend.cuda import select_device
                select_device(world.local_rank)
            be = get_backend(cfg.run.device)
        except (RuntimeError, ImportError) as e:  # e.g. no GPU on this node
            raise ConfigError(f"run.device = {cfg.run.device!r}: {e}") from None
        if cfg.run.tensorboard:
            from hpcdp.tb_events import check_available
            check_available()  # run.tensorboard without tensorboardX: one line, every rank
        ds = load_dataset(cfg.data, task_of(cfg.model), cfg.run.dtype, comm=world.comm,
                          timeout=setup_s, block_size=cfg.model.block_size)
        check_model_fits_data(cfg.model, ds)
        strategy = (build_strategy or default_build_strategy)(cfg.parallel, world, cfg.comm)
        if model is None:  # layout and init recipes only: nothing allocated yet
            from hpcdp.nn import build_model
            model = build_model(cfg.model, dtype=cfg.run.dtype, device=cfg.run.device, storage=())
        flat = model.flat
        optimizer = build_optimizer(cfg.optim, layout=flat.layout, dtype=cfg.run.dtype, device=cfg.run.device)
        wire = (f"parallel.{cfg.parallel.strategy}.comm_dtype",  # a 16-bit gradient wire, named in remedies
                getattr(cfg.parallel.sub(), "comm_dtype", "float32"))
        checks = StepChecks(cfg.train.on_nonfinite, world.rank, optimizer, wire=wire,  # non-finite guard
                            max_skips=cfg.train.max_consecutive_skips, layout=flat.layout)
        check_state_fits(cfg, strategy, flat, world)  # refuse before allocating the state
        flat.materialize(strategy.full_storage)  # the full buffers this strategy keeps (maybe none)
        checks.setup()
    with stage(world.comm, "strategy setup", timeout=setup_s, skew=schedule_differences) as agreed:
        strategy.setup(flat, optimizer, world)  # SingleRank raises here on > 1 rank
        init_line = None
        if cfg.model.init_from and not resume:  # weights made elsewhere; --resume wins
            from hpcdp.io.interop.init_from import init_from
            init_line = init_from(cfg.model.init_from, strategy, flat, cfg.model, world.comm,
                                  corpus_tokenizer=ds.info.get("tokenizer"), timeout=setup_s)
        exact = None
        if cfg.train.reproducible == "exact":  # bit-identical weights for any N (hpcdp/exact/)
            from hpcdp.exact.mode import ExactMode
            exact = ExactMode(cfg.train, strategy, world, flat)
        batches = BatchSource(ds, cfg.data, cfg.train, strategy.dp_size, strategy.dp_rank)
        rescale_line = None
        if resume and cfg.failure.batch == "scale":  # the checkpoint's per-rank batch goes on
            from hpcdp.io.checkpointer import resumed_batches
            sampler, rescale_line = resumed_batches(resume, cfg, batches.sampler, strategy.dp_size)
            batches.close()
            batches = BatchSource(ds, cfg.data, cfg.train, strategy.dp_size, strategy.dp_rank, sampler=sampler)
        total = batches.total
        in_effect = batches.sampler.global_batch
        if cfg.failure.batch == "scale" and in_effect % strategy.dp_size:
            n = strategy.dp_size
            raise ConfigError(f"failure.batch: 'scale' keeps each rank's batch after a lost rank, so the global "
                              f"batch of {in_effect} samples must be a multiple of the {n} ranks: set "
                              f"train.global_batch = {in_effect // n * n or n} or {(in_effect // n + 1) * n}, "
                              "or failure.batch = 'keep'")
        if cfg.failure.on_rank_loss == "continue" and world.size > 1:  # ULFM there? one line if not
            from mpi4py import MPI

            from hpcdp.failure.ulfm import check_available
            check_available(MPI)
        accum = cfg.train.grad_accum
        if in_effect < strategy.dp_size * accum:
            raise ConfigError(f"train.global_batch: {in_effect} samples cannot feed "
                              f"{strategy.dp_size} ranks x {accum} micro-batches; needs >= {strategy.dp_size * accum}")
        agreed.fingerprint = schedule_text(ds, total, batches.batches_per_epoch)  # same data everywhere
        if resume and world.rank == 0:  # a checkpoint of another model: one line, status 2, no run dir
            from hpcdp.io.checkpointer import check_resume_target
            check_resume_target(resume, cfg, flat, optimizer, batches.sampler)

    # The run directory: named on world rank 0, known to every rank.
    def make_run_dir():
        path = new_run_dir(cfg.run)
        if cfg.checkpoint.enabled and not cfg.checkpoint.dir:  # checkpoints go to <run dir>/checkpoints:
            from hpcdp.io.lock import acquire                  # locked too (run.out_dir may be shared)
            held.append(acquire(Path(path) / "checkpoints", cfg.run.name))
        resolved = cfg.to_dict()
        resolved["run"]["out_dir"] = path
        (Path(path) / "config.toml").write_text(dump_toml(resolved))
        return path

    run_dir = on_root(world.comm, make_run_dir, what="the run directory", timeout=setup_s)
    # Checkpoints (hpcdp/io/): save every K steps / on SIGTERM, SIGUSR1; --resume.
    ckpt = Checkpointer(cfg, world=world, strategy=strategy, model=model, optimizer=optimizer,
                        sampler=batches.sampler, total=total, run_dir=run_dir, resume=resume)

    # Workers get their own communicator for metrics; server ranks only serve.
    comm = world.comm
    if world.size > 1:
        from mpi4py import MPI

        from hpcdp.failure.deadline import watchdog
        with watchdog(cfg.comm.timeout, "splitting off the workers' communicator"):
            comm = world.comm.Split(0 if strategy.is_worker else MPI.UNDEFINED, world.rank)
    if not strategy.is_worker:
        # A dedicated server: restores with the workers (--resume), then serves; the
        # workers' save requests reach it through the PS protocol (ckpt.save on it).
        try:
            ckpt.restore()
            # a stop signal that reaches only this rank goes on to the workers, which decide
            strategy.serve(on_save=lambda at, wait: ckpt.save(at, wait=wait), on_poll=ckpt.serve_poll)
            ckpt.close()
            strategy.close()
        except BaseException as e:
            release(strategy, e, None)  # failing: drop requests, wait for no peer
            raise
        finally:
            ckpt.close(abandon=True)
        return {"run_dir": run_dir, "role": "server", "checkpoint": str(ckpt.saved_path or "") or None}

    writer_rank = comm.Get_rank() == 0
    # every rank's figures reach metrics.jsonl at least every few seconds (hpcdp.metrics)
    gather = StepGather(comm, timeout=cfg.comm.timeout, flush_every_s=cfg.run.metrics_flush_s)
    writer = open_metrics(cfg, run_dir if writer_rank else None, total, ds, out)
    floor = ds.info.get("loss_floor")
    uniform = math.log(ds.n_classes)  # the loss of predicting every class (token) alike
    if writer_rank:
        writer.log(f"run dir: {run_dir}")
        for line in getattr(cfg, "warnings", ()):  # config keys this run does not read (config_applies)
            writer.log(line)
        writer.log(f"data: {ds.describe()}" + (f"; loss floor (exact conditional entropy) "
                                               f"{floor:.4f} nats, a uniform guess {uniform:.4f}"
                                               if floor is not None else ""))
        if exact is not None:
            writer.log(exact.describe())
        for lock in held:
            if lock.took_over:
                writer.log(f"checkpoint.dir: took over a stale lock ({lock.took_over})")
        if init_line:
            writer.log(init_line)
        if rescale_line:
            writer.log(rescale_line)
        writer.log(f"model: {cfg.model.kind}, {flat.numel:,} parameters ({cfg.run.dtype}, {cfg.run.device}); "
                   f"strategy {cfg.parallel.strategy} on {comm.Get_size()} worker(s) of {world.size} rank(s); "
                   f"{total} steps of {batches.sampler.global_batch} samples ({batches.batches_per_epoch} per epoch)")
        layout_line = getattr(strategy, "layout_line", None)  # e.g. DiLoCo's replica groups
        if layout_line is not None:
            writer.log(layout_line())

    def run_eval(step):
        res = evaluate(model, ds, cfg.train.eval_batch, strategy.dp_rank, strategy.dp_size, comm, be,
                       timeout=cfg.comm.timeout, ignore_index=ignore)
        if floor is not None:
            res["loss_floor"] = floor
        if writer_rank or flat.data is None:  # sharded parameters: a gather on every worker
            res["weights_sha256"] = weights_sha256(flat, strategy)  # equal for any N in exact mode
        if writer_rank:
            writer.write({"eval": {"step": step, **res}})
            writer.log(f"eval @ step {step}: loss {res['loss']:.4f}  accuracy {res['accuracy']:.4f}"
                       + (f"  (loss floor {floor:.4f}, uniform guess {uniform:.4f}: "
                          f"{progress(res['loss'], uniform, floor)})" if floor is not None else "")
                       + f"  on {res['n']} {'tokens' if ds.task == 'sequence' else 'samples'}"
                       + f"  weights sha256 {res['weights_sha256']}")
        return res

    def fetch(batch, idx):  # samples of this step's batch, already read, as Tensors
        x, y = batch.fetch(idx)
        return Tensor(x, backend=be), Tensor(y, backend=be)

    last_loss, last_eval = float("nan"), None
    pending: list = []  # writer: this rank's part of each step record until the next flush
    step = notice = None
    try:
        start = ckpt.restore(writer.log if writer_rank else None)
        writer.first_step = start + 1
        notice = FirstStepNotice(writer.log) if writer_rank and start + 1 <= total else None
        # failure.on_rank_loss = "continue": a lost rank is repaired around (hpcdp.failure.ulfm)
        lasting = (Lasting(cfg, world, [comm, *exact_comms(exact), *ckpt.comms()])
                   if cfg.failure.on_rank_loss == "continue" and world.size > 1 else None)
        if lasting is not None:
            from hpcdp.failure.watch import note_survivors_go_on
            note_survivors_go_on()
        step = start
        while step < total:
            step += 1
            updates = optimizer.steps  # this step's update is applied once this grows
            try:
                t0 = time.perf_counter()
                lr = lr_at(cfg.optim, step, total)
                optimizer.lr = lr
                batch = batches.get(step - 1)  # this rank's samples of the step, read (prefetched)
                global_n = batch.n_global
                if ignore is not None:  # padding: each micro-batch weighs its counted tokens (hpcdp.nn.padding)
                    y_global = read_pairs(ds, batches.sampler.global_indices(step - 1))[1]
                    batch.local.weights = [slice_weight(batch.fetch(idx)[1], y_global, ignore)
                                           for idx in batch.local.micro]
                # checks: the non-finite loss check and the HPCDP_FAULT hook (hpcdp.failure.steps)
                loss_part = train_step(model, strategy, batch.local, lambda idx: fetch(batch, idx),
                                       checks=checks.at(step)).loss
                stats = {**strategy.step_stats(), **checks.stats(), **(exact.step_stats() if exact else {})}
                stats.update(be.memory.figures())  # model state per rank, by tag (backend/memory.py)
                dt = time.perf_counter() - t0
                if notice is not None:  # the first step is over: no "still compiling" line
                    notice.cancel()
                    notice = None
                gather.add(loss_part, batch.n_local, dt, {**stats, "data_wait_s": batch.wait_s})
                if writer_rank:
                    epoch, _ = batches.position(step - 1)
                    pending.append({"step": step, "epoch": epoch, "lr": lr, "global_batch": global_n,
                                    "samples_per_s": global_n / dt, "step_time_s": dt})
                stop = ckpt.after_step(step)  # saves when due; True on SIGTERM/SIGUSR1 (saved)
                evals_now = bool(cfg.run.eval_every) and step % cfg.run.eval_every == 0 and step != total
                if (step == start + 1 or step % cfg.run.log_every == 0 or step == total or evals_now or stop
                        or gather.due() or lasting is not None):
                    # due: every few seconds, or a full block (hpcdp.metrics); continue mode: every step
                    # Every rank flushes after the same steps; only the writer waits.
                    for rec, (loss_sum, ranks) in zip(pending, gather.flush()):
                        last_loss = loss_sum
                        writer.step({"step": rec["step"], "epoch": rec["epoch"], "loss": loss_sum,
                                     **{k: rec[k] for k in ("lr", "global_batch", "samples_per_s", "step_time_s")},
                                     "ranks": ranks})
                        if rec["step"] in (start + 1, total):
                            writer.log(memory_line(rec["step"], ranks, world.size - comm.Get_size()))
                    pending.clear()
                if evals_now:
                    last_eval = run_eval(step)
            except Exception as e:  # noqa: BLE001 - only a lost rank is repaired; the rest end the job
                if lasting is None:
                    raise
                if not lasting.repairable(e):  # every rank ends with this rank's line (ulfm.Ending)
                    lasting.end(e, world, comm, step, strategy, extra=exact_comms(exact) + ckpt.comms())
                committed = step if optimizer.steps > updates else step - 1  # applied here or not
                rep = lasting.repair(e, world, comm, committed, step, flat, optimizer, strategy, t0,
                                     extra=exact_comms(exact) + ckpt.comms())
                world, comm = lasting.world, rep.comm
                if exact is not None:  # its codec agrees on the survivors' communicator from here on
                    from hpcdp.exact.mode import ExactMode
                    exact.abandon()
                    exact = ExactMode(cfg.train, strategy, world, flat)
                writer_rank = world.rank == 0
                gather = StepGather(comm, timeout=cfg.comm.timeout, flush_every_s=cfg.run.metrics_flush_s)
                pending.clear()
                batches.close()
                # the step's data re-split over the survivors: the same global batch ("keep"), or
                # the same per-rank batch from the redone step on ("scale": hpcdp.data.rescale)
                sampler = rescaled(batches.sampler, rep.step, lasting.batch_after(rep, batches.sampler.global_batch))
                batches = BatchSource(ds, cfg.data, cfg.train, strategy.dp_size, strategy.dp_rank, sampler=sampler)
                if batches.total != total:  # train.epochs: as many steps as the epochs now take
                    total = writer.total = batches.total
                ckpt.follow(sampler, total)  # its checkpoints record the batch schedule in effect
                # a save in flight failed with the lost rank, or the agreed step's was due and not begun
                redo_save = ckpt.rejoin(world, committed=rep.step) is not None
                record = lasting.record(rep, rep.at_step)
                if redo_save:
                    record["checkpoint_saved_again"] = rep.step
                if writer_rank:
                    writer.write({"repair": record})
                    writer.log(lasting.line(rep, rep.at_step))
                if redo_save:  # the agreed step's checkpoint, complete on the survivors
                    ckpt.save(rep.step, wait=True)
                step = rep.step
                continue
            if stop:
                break
        ckpt.close()
        # Evaluate the final weights: an asynchronous strategy (ps, mode = "async")
        # applies its outstanding updates here; ZeRO-3 still gathers units in eval.
        strategy.finish_updates()
        if not ckpt.stopped_by:  # stopped by a signal: saved, exit now
            last_eval = run_eval(total)
            sample_at_end(model, ds, cfg.sample, writer if writer_rank else None, run_dir)
        gather.close()
        strategy.close()  # idempotent; frees the strategy's communicator and hooks
        if writer_rank:
            writer.summary(run_dir=run_dir, checkpoint=ckpt.saved_path,
                           extra=[Path(run_dir) / "sample.txt"] if (Path(run_dir) / "sample.txt").exists() else ())
    except BaseException as e:
        if notice is not None:  # failed in the first step: no "still compiling" line after the error
            notice.cancel()
        release(strategy, e, step)  # failing: note the step, drop requests, wait for no peer
        if writer_rank:
            write_failure(writer, pending, gather, e, step)
        raise
    finally:
        batches.close()
        if exact is not None:
            exact.close()
        ckpt.close(abandon=True)
        writer.close()
        if comm is not world.comm:
            comm.Free()
    return {"run_dir": run_dir, "steps": total, "loss": last_loss, "eval": last_eval,
            "stopped_by": ckpt.stopped_by, "checkpoint": str(ckpt.saved_path) if ckpt.saved_path else None}


def open_metrics(cfg, run_dir, total: int, ds, out) -> MetricsWriter:
    """The writer of metrics.jsonl, train.log (timestamped log lines) and, with
    ``run.tensorboard``, TensorBoard events; ``run_dir`` None: a rank that writes nothing."""
    events = None
    if run_dir is not None and cfg.run.tensorboard:
        from hpcdp.tb_events import TensorBoardEvents
        events = TensorBoardEvents(Path(run_dir) / "tensorboard")
    return MetricsWriter(Path(run_dir) / "metrics.jsonl" if run_dir is not None else None, total,
                         cfg.run.log_every, out=out,
                         log_path=Path(run_dir) / "train.log" if run_dir is not None else None,
                         tokens_per_sample=cfg.model.block_size if ds.task == "sequence" else None,
                         rank_lists=(cfg.run.rank_lists_up_to, cfg.run.rank_lists_every), events=events)


def exact_comms(exact) -> list:
    """Exact mode's own communicator (its codec's agreements), when it has one."""
    return [exact.worker_comm] if exact is not None and exact.worker_comm is not None else []


def write_failure(writer, pending: list, gather, e: BaseException, step) -> None:
    """The writer rank is failing: its steps not yet gathered go to metrics.jsonl (this
    rank's figures), and the cause to train.log; never raises over the failure."""
    try:
        why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        writer.unflushed(pending, gather.own_rows(), why)
        agreed = step_of(e)  # the step the survivors of a lost rank agreed on, if any
        writer.note(f"failed at step {step if agreed is None else agreed}: {why}")
    except Exception:  # noqa: BLE001 - the failure being reported matters more
        pass


def progress(loss: float, uniform: float, floor: float) -> str:
    """How far ``loss`` got from a uniform guess towards the floor, in words."""
    if not (uniform > floor) or not math.isfinite(loss):
        return "n/a"
    return f"{100 * (uniform - loss) / (uniform - floor):.0f}% of the way from the uniform guess to the floor"


def check_state_fits(cfg, strategy, flat, world) -> None:
    """Refuse, on every rank and before any allocation, a run whose model state per
    node exceeds the node's available memory (hpcdp.memcheck)."""
    from hpcdp.memcheck import GIB, check_fits, optim_slots, state_bytes

    itemsize = np.dtype(cfg.run.dtype).itemsize
    n, stage = flat.numel, getattr(strategy, "stage", 0)
    need = state_bytes(stage, [(0, n)], strategy_ranks(strategy, world), 0, itemsize,
                       optim_slots(cfg.optim))["total"]
    z3 = state_bytes(3, [(0, n)], world.size, 0, itemsize, optim_slots(cfg.optim))["total"]
    hint = ("" if stage == 3 else f"ZeRO stage 3 would need {z3 / GIB:.2f} GiB per rank: "
            "--set parallel.strategy=zero --set parallel.zero.stage=3")
    check_fits(world, need, strategy=cfg.parallel.strategy, hint=hint)


def strategy_ranks(strategy, world) -> int:
    """How many ranks share the sharded state (ZeRO: all of them, or one node's with
    ``parallel.zero.shard = "node"``)."""
    if not getattr(strategy, "stage", 0):
        return 1
    return strategy.state_ranks(world) if hasattr(strategy, "state_ranks") else world.size


def memory_line(step: int, ranks: dict, servers: int = 0) -> str:
    """One log line: each worker rank's model state (persistent), tagged peak and peak
    RSS; ``servers``: dedicated parameter-server ranks, which report no step figures."""
    def mib(key):
        return "[" + ", ".join(f"{v / 2**20:.1f}" for v in ranks.get(key, [])) + "]"
    who = f"per worker rank; the {servers} server rank(s) are not listed" if servers else "per rank"
    return (f"memory @ step {step} (MiB {who}): model state {mib('mem_persistent_bytes')} "
            f"(params {mib('mem_params_bytes')}, grads {mib('mem_grads_bytes')}, "
            f"optim {mib('mem_optim_bytes')}); peak with working buffers {mib('mem_peak_bytes')}; "
            f"peak RSS {mib('rss_peak_bytes')}")


def main_train(config_path=None, overrides=(), out=None, resume=None, build_strategy=None) -> dict:
    """``hpcdp train``: load the config (None: built-in default) and train. Every rank
    loads its own config; they must agree (hpcdp.failure.skew) before anything else.
    ``build_strategy``: see :func:`run_training`."""
    from hpcdp.config import CommConfig, load_config
    from hpcdp.failure.agreement import stage
    from hpcdp.failure.skew import config_differences, config_text
    from hpcdp.world import World

    world = World.from_mpi()
    with stage(world.comm, "config", timeout=CommConfig().setup_timeout, skew=config_differences) as agreed:
        cfg = load_config(config_path, overrides)
        agreed.timeout, agreed.fingerprint = cfg.comm.setup_timeout, config_text(cfg)
    world.device = cfg.run.device
    from hpcdp.failure.shutdown import expect_peers_within
    expect_peers_within(cfg.comm.timeout)  # the final barrier's deadline (hpcdp train's end)
    return run_training(cfg, world=world, out=out, resume=resume, build_strategy=build_strategy)


__all__ = ["run_training", "evaluate", "check_model_fits_data", "main_train", "task_of"]
