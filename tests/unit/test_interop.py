"""Models that leave and enter hpcdp, without torch: ``hpcdp ckpt export --format
safetensors|hf-gpt2`` and ``model.init_from`` round-trip a trained GPT's weights
exactly (whole, and as ZeRO-3-like shards that read only their ranges); every
mismatch is one line naming the first difference; a tokenizer.json corpus
(``hpcdp data train-tokenizer``, ``prepare --tokenizer``) round-trips held-out text,
trains and samples, and a mismatched tokenizer is refused. The transformers side of
the proof is tests/hf."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hpcdp.config import load_config
from hpcdp.data import DataError
from hpcdp.io.errors import CheckpointError
from hpcdp.io.format.names import PARAM
from hpcdp.io.interop.init_from import init_from
from hpcdp.io.protocol import Piece
from hpcdp.io.restore.weights import model_from_checkpoint
from hpcdp.nn import build_model
from hpcdp.shard import shard_range

from hpcdp.launch import THREAD_ENV
from interop_jobs import ROOT, SOURCES, byte_corpus, hpcdp, job_text, ok

CKPT = "ck/step-00000002"


class Targets:
    """What a strategy hands the checkpoint protocol: the pieces this rank fills."""

    def __init__(self, pieces):
        self.pieces, self.restored = pieces, False

    def checkpoint_targets(self):
        return self.pieces

    def checkpoint_restored(self):
        self.restored = True


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A GPT (untied head, exact GELU: the non-default forms) trained 2 steps; exported."""
    d = tmp_path_factory.mktemp("interop")
    byte_corpus(d)
    (d / "job.toml").write_text(job_text(tied=False, gelu="exact"))
    ok(hpcdp(d, "train", "--config", "job.toml"))
    out = ok(hpcdp(d, "ckpt", "export", CKPT, "w.safetensors"))
    assert "wrote 29 tensors to w.safetensors" in out  # 28 + the untied head
    out = ok(hpcdp(d, "ckpt", "export", CKPT, "hf", "--format", "hf-gpt2"))
    assert "GPT2LMHeadModel.from_pretrained('hf')" in out and "bos/eos ids null" in out
    return d


def fresh(d, *sets):
    cfg = load_config(d / "job.toml", sets)
    return cfg, build_model(cfg.model, dtype=cfg.run.dtype, device="cpu", storage=("data",))


def checkpoint_weights(d) -> np.ndarray:
    return model_from_checkpoint(str(d / CKPT))[2].flat.data.copy()


@pytest.mark.parametrize("source", ["w.safetensors", "hf"])
def test_init_from_an_export_gives_the_checkpoint_weights_exactly(trained, source):
    cfg, model = fresh(trained)
    before = model.flat.data.copy()
    t = Targets([Piece(PARAM, 0, model.flat.data)])
    line = init_from(trained / source, t, model.flat, cfg.model, None)
    want = checkpoint_weights(trained)
    assert not np.array_equal(before, want)  # the random init is not the trained weights
    np.testing.assert_array_equal(model.flat.data, want)
    assert t.restored and f"{want.size:,} of {want.size:,} parameters read" in line


@pytest.mark.parametrize("source", ["w.safetensors", "hf"])
def test_a_shard_reads_only_its_ranges(trained, source):
    """ZeRO-3's targets are ranges cut anywhere (inside tensors, inside rows, across
    the transposed head): each of 3 ranks fills exactly its elements."""
    cfg, model = fresh(trained)
    want, n = checkpoint_weights(trained), model.flat.numel
    for rank in range(3):
        off, size = shard_range(n, 3, rank)
        pieces = [Piece(PARAM, off, np.zeros(size // 2, model.flat.data.dtype)),
                  Piece(PARAM, off + size // 2, np.zeros(size - size // 2, model.flat.data.dtype))]
        line = init_from(trained / source, Targets(pieces), model.flat, cfg.model, None)
        got = np.concatenate([p.array for p in pieces])
        np.testing.assert_array_equal(got, want[off:off + size])
        assert f"{size:,} of {n:,} parameters read" in line


def test_hf_folder_is_gpt2lmheadmodels_layout(trained):
    conf = json.loads((trained / "hf" / "config.json").read_text())
    assert conf["activation_function"] == "gelu" and conf["tie_word_embeddings"] is False
    assert conf["layer_norm_epsilon"] == 1e-5 and conf["bos_token_id"] is None and conf["eos_token_id"] is None
    assert (conf["n_positions"], conf["n_embd"], conf["n_layer"], conf["n_head"], conf["vocab_size"]) == \
        (16, 16, 2, 2, 256)
    hf = load_file(str(trained / "hf" / "model.safetensors"))
    ours = load_file(str(trained / "w.safetensors"))
    assert set(hf) == {"lm_head.weight"} | {"transformer." + k for k in ours if k != "lm_head.weight"}
    assert hf["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)  # Conv1D: (in, out)
    np.testing.assert_array_equal(hf["lm_head.weight"], ours["lm_head.weight"].T)  # nn.Linear: (out, in)


@pytest.mark.parametrize("source,sets,message", [
    ("hf", ["model.n_embd=32"], "n_embd is 16 there, model.n_embd = 32 here: set model.n_embd = 16"),
    ("hf", ["model.block_size=8"], "n_positions is 16 there, model.block_size = 8 here"),
    ("hf", ["model.tied_head=true"], "tie_word_embeddings is false there, model.tied_head = true here"),
    ("hf", ['model.gelu="tanh"'], "activation_function is 'gelu' there, model.gelu = 'tanh' here"),
    ("hf", ["model.vocab_size=300"], "vocab_size is 256 there, model.vocab_size = 300 here"),
    ("w.safetensors", ['model.gelu="tanh"'], "model.gelu is 'exact' in the file's config, 'tanh' here"),
    ("w.safetensors", ["model.n_layer=1"], "model.n_layer is 2 in the file's config, 1 here"),
    ("nowhere", [], "nowhere: no such file or folder"),
])
def test_a_mismatch_is_one_error_naming_the_first_difference(trained, source, sets, message):
    cfg, model = fresh(trained, *sets)
    with pytest.raises(CheckpointError, match="model.init_from: .*" + _re(message)):
        init_from(trained / source, Targets([Piece(PARAM, 0, model.flat.data)]), model.flat, cfg.model, None)


def _re(text):
    return re.escape(text)


def test_foreign_files_name_the_tensor_or_what_is_missing(trained, tmp_path):
    cfg, model = fresh(trained)
    t = Targets([Piece(PARAM, 0, model.flat.data)])
    arrays = load_file(str(trained / "w.safetensors"))
    # no hpcdp metadata: the tensors decide
    save_file({**arrays, "wpe.weight": np.zeros((8, 16), np.float32)}, str(tmp_path / "short.safetensors"))
    with pytest.raises(CheckpointError, match=r"tensor wpe.weight has shape \(8, 16\) there, \(16, 16\)"):
        init_from(tmp_path / "short.safetensors", t, model.flat, cfg.model, None)
    save_file({k: v for k, v in arrays.items() if k != "lm_head.weight"}, str(tmp_path / "tied.safetensors"))
    with pytest.raises(CheckpointError, match="tensor lm_head.weight of this model is not in it"):
        init_from(tmp_path / "tied.safetensors", t, model.flat, cfg.model, None)
    save_file({k: v.astype(np.int32) for k, v in arrays.items()}, str(tmp_path / "int.safetensors"))
    with pytest.raises(CheckpointError, match="is I32; hpcdp reads F16, F32 and F64"):
        init_from(tmp_path / "int.safetensors", t, model.flat, cfg.model, None)
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    shutil.copy(trained / "hf" / "config.json", pickled)
    (pickled / "pytorch_model.bin").write_bytes(b"\x80")
    with pytest.raises(CheckpointError, match="only pytorch_model.bin: hpcdp reads no pickle files"):
        init_from(pickled, t, model.flat, cfg.model, None)
    (tmp_path / "bare").mkdir()
    with pytest.raises(CheckpointError, match="a folder without config.json"):
        init_from(tmp_path / "bare", t, model.flat, cfg.model, None)


def test_float64_run_from_a_float32_export_converts(trained):
    cfg, model = fresh(trained, 'run.dtype="float64"')
    init_from(trained / "hf", Targets([Piece(PARAM, 0, model.flat.data)]), model.flat, cfg.model, None)
    np.testing.assert_array_equal(model.flat.data, checkpoint_weights(trained).astype(np.float64))


STRATEGIES = {"ddp": ['parallel.strategy="ddp"'],
              "ps": ['parallel.strategy="ps"', "parallel.ps.servers=2"],
              "zero3": ['parallel.strategy="zero"', "parallel.zero.stage=3"]}


def test_every_strategy_starts_from_the_imported_weights(trained):
    """2 real ranks: DDP (replicas read everything), the parameter server (2 servers
    keep private shard copies) and ZeRO-3 (each rank reads its shard) train the
    same loss curve from the export, in float64."""
    curves, reads = {}, {}
    for name, sets in STRATEGIES.items():
        args = ["train", "--config", "job.toml", "--set", 'model.init_from="hf"', "--set", 'run.dtype="float64"',
                "--set", "train.steps=3", "--set", f'run.out_dir="s-{name}"', "--set", f'checkpoint.dir="ck-{name}"']
        for x in sets:
            args += ["--set", x]
        out = ok(hpcdp(trained, *args, ranks=2))
        m = re.search(r"model.init_from: hf \(hf-gpt2\): ([\d,]+) of ([\d,]+) parameters read on this rank", out)
        assert m, out
        reads[name] = (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", "")))
        lines = [json.loads(x) for x in (trained / f"s-{name}" / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [x["loss"] for x in lines if "step" in x and "loss" in x]
        # and out again from this 2-rank checkpoint (ZeRO-3's: sharded parameters): its exact weights
        ok(hpcdp(trained, "ckpt", "export", f"ck-{name}", f"{name}.safetensors"))
        model = model_from_checkpoint(str(trained / f"ck-{name}"))[2]
        got = load_file(str(trained / f"{name}.safetensors"))
        assert set(got) == set(model.flat.params)
        for key, arr in got.items():
            np.testing.assert_array_equal(arr, model.flat.params[key].data)
    n = reads["ddp"][1]
    assert reads["ddp"] == reads["ps"] == (n, n)
    assert 0 < reads["zero3"][0] < n  # rank 0's shard only
    assert len(curves["ddp"]) == 3
    np.testing.assert_allclose(curves["ps"], curves["ddp"], rtol=1e-9)
    np.testing.assert_allclose(curves["zero3"], curves["ddp"], rtol=1e-9)
    # the first loss is the imported weights' (the random init's is another)
    (trained / "plain.toml").write_text(job_text(tied=False, gelu="exact", out="plain", ckpt="ck-plain", steps=1,
                                                 dtype="float64"))
    ok(hpcdp(trained, "train", "--config", "plain.toml"))
    plain = [json.loads(x) for x in (trained / "plain" / "metrics.jsonl").read_text().splitlines()]
    assert abs([x["loss"] for x in plain if "step" in x][0] - curves["ddp"][0]) > 1e-3


def test_train_refuses_a_mismatch_in_one_line(trained):
    proc = hpcdp(trained, "train", "--config", "job.toml", "--set", 'model.init_from="hf"',
                 "--set", "model.n_embd=32", "--set", 'run.out_dir="bad"', "--set", 'checkpoint.dir="ck-bad"')
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hpcdp: error: model.init_from: hf: n_embd is 16 there, model.n_embd = 32 here: set model.n_embd = 16"]


def test_export_usage_errors(trained):
    proc = hpcdp(trained, "ckpt", "export", CKPT, "w.bin")
    assert proc.returncode == 2 and "cannot tell the format from 'w.bin'" in proc.stderr
    proc = hpcdp(trained, "ckpt", "export", CKPT, "w.safetensors", "--optimizer")
    assert proc.returncode == 2 and "holds weights only" in proc.stderr
    proc = hpcdp(trained, "ckpt", "export", CKPT, "w.h5", "--format", "npz")
    assert proc.returncode == 2 and "w.h5 must end in .npz for --format npz" in proc.stderr
    ok(hpcdp(trained, "ckpt", "export", "ck", "newest.safetensors"))  # a folder: its newest checkpoint
    assert load_file(str(trained / "newest.safetensors")).keys() == load_file(str(trained / "w.safetensors")).keys()


# -- a subword tokenizer ------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE trained on hpcdp/io's files (its sub-folders too) except four held out."""
    d = tmp_path_factory.mktemp("bpe")
    files = sorted(SOURCES.rglob("*.py"))
    train, held = d / "train", d / "held"
    train.mkdir(), held.mkdir()
    for i, f in enumerate(files):  # format/h5.py -> format_h5.py: one flat folder, no name twice
        shutil.copy(f, (held if i % 9 == 4 else train) / "_".join(f.relative_to(SOURCES).parts))
    out = ok(hpcdp(d, "data", "train-tokenizer", "--text", train, "--vocab-size", 400, "--out", "tok.json"))
    assert "vocabulary 400" in out
    ok(hpcdp(d, "data", "prepare", "--text", train, held, "--tokenizer", "tok.json", "--out", "corpus.h5"))
    return d


def test_trained_tokenizer_round_trips_held_out_files(bpe):
    from hpcdp.data.bpe import HFTokenizer

    tok = HFTokenizer.from_file(bpe / "tok.json")
    held = sorted((bpe / "held").iterdir())
    assert len(held) >= 2
    for f in held:
        text = f.read_text(encoding="utf-8")
        ids = tok.encode(text)
        assert len(ids) < 0.7 * len(text.encode())  # subwords: fewer tokens than bytes
        assert tok.decode(ids) == text


def test_corpus_records_its_tokenizer_and_decodes_with_it(bpe):
    import h5py

    from hpcdp.data.bpe import HFTokenizer
    from hpcdp.data.corpus import open_corpus

    f, tok = open_corpus(bpe / "corpus.h5")
    with f:
        assert f.attrs["format_version"] == 2 and f.attrs["tokenizer"] == "hf"
        assert f.attrs["tokenizer_sha256"] == HFTokenizer.from_file(bpe / "tok.json").sha256
        names = [n.decode() for n in f["train/doc_names"][()]]
        starts = f["train/doc_starts"][()]
        first = tok.decode(f["train/tokens"][starts[0]:starts[1]])
    assert first == (bpe / "train" / names[0].rsplit("/", 1)[-1]).read_text(encoding="utf-8")
    assert h5py.is_hdf5(bpe / "corpus.h5")


def test_gpt_trains_samples_and_exports_with_the_tokenizer(bpe):
    (bpe / "job.toml").write_text(job_text(vocab=400, steps=3))
    ok(hpcdp(bpe, "train", "--config", "job.toml", "--set", 'data.tokenizer="tok.json"'))
    text = ok(hpcdp(bpe, "sample", "--resume", "ck", "--length", 12, "--out", "s.txt"))
    assert text.startswith("def ") and len(text) > len("def ")  # text, decoded by the corpus's tokenizer
    assert (bpe / "s.txt").read_text(encoding="utf-8") in (text, text[:-1])  # stdout adds a newline
    ok(hpcdp(bpe, "ckpt", "export", "ck/step-00000003", "hf", "--format", "hf-gpt2"))
    conf = json.loads((bpe / "hf" / "config.json").read_text())
    assert conf["bos_token_id"] == conf["eos_token_id"] == 0  # <|endoftext|>, the first special token
    assert (bpe / "hf" / "tokenizer.json").read_text() == (bpe / "tok.json").read_text()
    tconf = json.loads((bpe / "hf" / "tokenizer_config.json").read_text())
    assert tconf["eos_token"] == tconf["bos_token"] == "<|endoftext|>" and tconf["model_max_length"] == 16


def test_a_mismatched_tokenizer_is_refused(bpe, tmp_path):
    other = tmp_path / "other.json"
    ok(hpcdp(tmp_path, "data", "train-tokenizer", "--text", bpe / "held", "--vocab-size", 300, "--out", other))
    (bpe / "job2.toml").write_text(job_text(vocab=400, out="run2", ckpt="ck2"))
    proc = hpcdp(bpe, "train", "--config", "job2.toml", "--set", f'data.tokenizer="{other}"')
    assert proc.returncode == 2 and "was made with another tokenizer than" in proc.stderr, proc.stderr
    # a model whose tokenizer.json is not the corpus's: its embedding rows mean other tokens
    from hpcdp.data.bpe import HFTokenizer
    from hpcdp.data.tokenizer import Tokenizer
    from hpcdp.io.interop.init_from import open_source, tokenizer_problem

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file({"transformer.wte.weight": np.zeros((2, 2), np.float32)}, str(folder / "model.safetensors"))
    shutil.copy(other, folder / "tokenizer.json")
    src = open_source(folder)
    assert "is not the tokenizer data.path was made with" in tokenizer_problem(
        src, HFTokenizer.from_file(bpe / "tok.json"))
    assert "data.path was made with the byte tokenizer" in tokenizer_problem(src, Tokenizer.byte())
    assert tokenizer_problem(src, HFTokenizer.from_file(other)) is None


def test_an_export_replaces_only_an_earlier_export_and_whole(bpe, trained, tmp_path):
    """Into an earlier export (with a tokenizer): the folder is replaced whole, so the
    earlier model's tokenizer.json does not stay beside a model without one (whose
    bos/eos are null); a folder of anything else is refused unless --force; an
    interrupted export leaves the earlier folder as it was."""
    from safetensors import safe_open

    from hpcdp.io.interop.export import write_folder_whole

    shutil.copytree(bpe / "hf", tmp_path / "hf")
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    out = ok(hpcdp(tmp_path, "ckpt", "export", trained / CKPT, "hf", "--format", "hf-gpt2"))
    assert "no tokenizer.json (" in out and "bos/eos ids null" in out
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert conf["bos_token_id"] is None and conf["eos_token_id"] is None and conf["vocab_size"] == 256
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "hpcdp_export": "2"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary folder left
    # a folder of the user's: refused, untouched; --force replaces it
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "config.json").write_text("my settings\n")
    (notes / "todo.txt").write_text("x\n")
    proc = hpcdp(tmp_path, "ckpt", "export", trained / CKPT, "notes", "--format", "hf-gpt2")
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "hpcdp ckpt export: error: export --format hf-gpt2: notes is a folder that is not an earlier export "
        "(it holds config.json, todo.txt); the export replaces the whole folder: give a new or empty one, or "
        "add --force to replace it")
    assert (notes / "config.json").read_text() == "my settings\n"
    ok(hpcdp(tmp_path, "ckpt", "export", trained / CKPT, "notes", "--format", "hf-gpt2", "--force"))
    assert sorted(p.name for p in notes.iterdir()) == ["config.json", "model.safetensors"]
    # interrupted while writing: the earlier export stays whole, no temporary folder is left
    before = (tmp_path / "hf" / "model.safetensors").read_bytes()

    def fail(folder):
        (folder / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_folder_whole(tmp_path / "hf", fail)
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == before
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == conf
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_init_from_refuses_a_tokenizer_larger_than_the_models_vocabulary(bpe, trained, tmp_path):
    """A tokenizer.json of 400 tokens beside a 256-token model (an earlier model's file):
    refused in one line, before any weight is read; padded vocabularies pass."""
    shutil.copytree(trained / "hf", tmp_path / "hf")
    shutil.copy(bpe / "tok.json", tmp_path / "hf" / "tokenizer.json")
    proc = hpcdp(trained, "train", "--config", "job.toml", "--set", f'model.init_from="{tmp_path / "hf"}"',
                 "--set", 'run.out_dir="stale"', "--set", 'checkpoint.dir="ck-stale"')
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"hpcdp: error: model.init_from: {tmp_path / 'hf'}: its tokenizer.json has 400 tokens, more than "
        "config.json's vocab_size 256: it is not this model's tokenizer (an earlier model's file left in the "
        "folder?); remove it, or export the model again into a new folder"]
    from hpcdp.io.interop.init_from import open_source, tokenizer_size

    assert tokenizer_size((bpe / "tok.json").read_text()) == 400
    conf = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**conf, "vocab_size": 448}))
    open_source(tmp_path / "hf").close()  # 400 tokens in 448 rows: a padded vocabulary


def test_tokenizer_errors_are_one_line(tmp_path):
    proc = hpcdp(tmp_path, "data", "train-tokenizer", "--text", SOURCES, "--vocab-size", 100, "--out", "t.json")
    assert proc.returncode == 2 and "--vocab-size: 100 is too small" in proc.stderr
    proc = hpcdp(tmp_path, "data", "prepare", "--text", SOURCES, "--tokenizer", "missing.json", "--out", "c.h5")
    assert proc.returncode == 2 and "--tokenizer missing.json: cannot read it" in proc.stderr
    with pytest.raises(DataError, match="not a Hugging Face tokenizer.json"):
        from hpcdp.data.bpe import HFTokenizer
        HFTokenizer('{"version": "1.0"}')
    from hpcdp.config import ConfigError
    with pytest.raises(ConfigError, match="data.tokenizer: only a token corpus"):
        load_config(None, ['data.tokenizer="t.json"'])  # digits: never silently ignored


def guide_block() -> list[str]:
    text = (ROOT / "docs" / "user-guide.md").read_text()
    section = text[text.index("### Models in and out"):]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_user_guide_commands_work_as_written(tmp_path):
    """docs/user-guide.md's round trip, line by line, in a shell (2 ranks under mpiexec)."""
    lines = guide_block()
    assert [x.split()[0] for x in lines] == ["hpcdp", "hpcdp", "mpiexec", "hpcdp", "mpiexec", "hpcdp"]
    shutil.copytree(SOURCES, tmp_path / "notes", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "job.toml").write_text(job_text(vocab=2000, ckpt="") + '[parallel]\nstrategy = "ddp"\n')
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for line in lines:
        proc = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (line, proc.stdout[-2000:], proc.stderr[-2000:])
    conf = json.loads((tmp_path / "gpt2-mine" / "config.json").read_text())
    assert conf["vocab_size"] == 2000 and conf["eos_token_id"] == 0
    assert (tmp_path / "gpt2-mine" / "tokenizer.json").read_text() == (tmp_path / "tokenizer.json").read_text()
    assert 'init_from = "gpt2-mine"' in (tmp_path / "ft" / "config.toml").read_text()
    assert (tmp_path / "ft" / "metrics.jsonl").read_text().count('"step"') >= 2  # it trained
    assert set(load_file(str(tmp_path / "mine.safetensors"))) == {
        k[len("transformer."):] for k in load_file(str(tmp_path / "gpt2-mine" / "model.safetensors"))}


def test_a_tokenizer_whose_regex_backtracks_without_end_is_one_line(tmp_path):
    """A pre-tokenizer regex that backtracks catastrophically on the text: the
    library panics (a Rust panic, not an Exception); prepare says so in one line
    naming the tokenizer file and the text file, and no traceback."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("(a+)+$"), "isolated")
    tok.save(str(tmp_path / "tok.json"))
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.txt").write_text("a" * 40000 + "b")
    proc = hpcdp(tmp_path, "data", "prepare", "--text", "text", "--tokenizer", "tok.json", "--out", "c.h5")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("hpcdp: error: --tokenizer tok.json: the tokenizer failed on ")
    assert "a.txt" in lines[0] and "retry-limit-in-match over" in lines[0]
    assert not (tmp_path / "c.h5").exists()
