"""Token corpora: hpcdp data prepare round-trips text, the window rule, the corpus dataset,
its errors, generation, and a GPT trained on a corpus end to end."""

import io
import json

import h5py
import numpy as np
import pytest

from hpcdp.cli import main as cli_main
from hpcdp.config import DataConfig, load_config
from hpcdp.data import DataError, load_dataset
from hpcdp.data.batches import read_pairs
from hpcdp.data.corpus import eval_starts
from hpcdp.data.prepare import collect_files, prepare_corpus
from hpcdp.data.sampler import WindowSampler, window_starts
from hpcdp.data.tokenizer import Tokenizer
from hpcdp.generate import generate, next_token

TEXTS = {
    "a.py": "def f(x):\n    return x + 1\n" * 30,
    "pkg/b.py": "# héllo wörld ✓\nclass B:\n    pass\n" * 40,
    "pkg/sub/c.txt": "plain text, not python\n" * 25,
    "pkg/.hidden/d.py": "hidden = True\n",
    "e.py": "",
}


@pytest.fixture
def textdir(tmp_path):
    root = tmp_path / "src"
    for name, text in TEXTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


def _docs(path):
    """{name: text} of every file in the corpus, from its tokens."""
    out = {}
    with h5py.File(path, "r") as f:
        tok = Tokenizer(f.attrs["tokenizer"], f["vocab"][()])
        for split in ("train", "val"):  # a file cut between the splits: its train part, then its val part
            t, starts = f[f"{split}/tokens"][()], list(f[f"{split}/doc_starts"][()]) + [len(f[f"{split}/tokens"])]
            for i, name in enumerate(f[f"{split}/doc_names"].asstr()[()]):
                out[name] = out.get(name, "") + tok.decode(t[starts[i]:starts[i + 1]])
    return out


@pytest.mark.parametrize("tokenizer", ["byte", "char"])
def test_prepare_round_trips_every_file(textdir, tmp_path, tokenizer):
    files = collect_files([textdir], "*.py")
    assert [n for _, n in files] == ["a.py", "e.py", "pkg/b.py"]  # sorted; hidden folders skipped
    s = prepare_corpus(files, tmp_path / "c.h5", tokenizer, val_fraction=0.3, seed=1)
    assert _docs(tmp_path / "c.h5") == {k: TEXTS[k] for k in ("a.py", "pkg/b.py")}  # empty e.py dropped
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["format"] == "hpcdp-tokens" and f.attrs["format_version"] == 1
        assert f["train/tokens"].chunks is None and f["train/tokens"].dtype == np.uint8
        total = len(f["train/tokens"]) + len(f["val/tokens"])
        assert len(f["val/tokens"]) == s["val_tokens"] == total - int(total * 0.7)  # exactly 30%
        assert s["cut_files"] <= 1  # whole files while they fit, then the end of one
        if tokenizer == "byte":
            assert s["vocab_size"] == 256
        else:
            assert s["vocab_size"] == len(set("".join(TEXTS[k] for k in ("a.py", "pkg/b.py"))))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5", "src"]  # no temporary left


def test_prepare_cuts_a_single_file_and_refuses_bad_input(textdir, tmp_path):
    s = prepare_corpus(collect_files([textdir / "a.py"]), tmp_path / "one.h5", val_fraction=0.25)
    n = len(TEXTS["a.py"].encode())
    assert (s["train_tokens"], s["val_tokens"]) == (int(n * 0.75), n - int(n * 0.75))
    (textdir / "bad.txt").write_bytes(b"caf\xe9\n")
    with pytest.raises(DataError, match=r"bad\.txt is not UTF-8.*--tokenizer byte"):
        prepare_corpus(collect_files([textdir], "*.txt"), tmp_path / "x.h5", "char")
    with pytest.raises(DataError, match=r"--text: no files matching '\*\.rs'"):
        collect_files([textdir], "*.rs")
    assert not (tmp_path / "x.h5").exists()


def test_val_fraction_is_reached_with_one_large_file(tmp_path):
    """One large file and ten small ones, --val-fraction 0.1: 10% of the tokens (by
    whole files, the large one put 46% there); whole small files first, then the end of
    one file; every file's text is kept, in one split or the two."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path / "text"
    root.mkdir()
    (root / "big.txt").write_text("the large file\n" * 5000)
    for k in range(10):
        (root / f"small{k}.txt").write_text(f"small file {k}\n" * 40)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-m", "hpcdp.cli", "data", "prepare", "--text", str(root), "--out", "c.h5",
                        "--val-fraction", "0.1", "--seed", "3"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    total = sum(p.stat().st_size for p in root.iterdir())
    n_val = total - int(total * 0.9)
    assert f"{total - n_val:,} train / {n_val:,} val tokens (10.0% val" in r.stdout, r.stdout
    docs = _docs(tmp_path / "c.h5")
    assert docs == {p.name: p.read_text() for p in root.iterdir()}
    with h5py.File(tmp_path / "c.h5", "r") as f:
        val = list(f["val/doc_names"].asstr()[()])
        train = list(f["train/doc_names"].asstr()[()])
    assert len(set(val) & set(train)) <= 1 and sorted(set(val) | set(train)) == sorted(docs)


def test_cli_data_prepare_and_info(textdir, tmp_path, capsys):
    out = tmp_path / "cli.h5"
    (textdir / "empty.py").write_text("")  # like an empty __init__.py (and e.py): found, holds no tokens
    assert cli_main(["data", "prepare", "--text", str(textdir), "--glob", "*.py", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    n = int(said.split(" file(s) from")[0])  # what was found, the empty one included
    assert "vocabulary 256" in said
    assert f"{n - 2} file(s) (2 empty one(s) left out: no tokens)" in said
    assert cli_main(["data", "info", str(out)]) == 0
    assert "tokenizer = 'byte'" in capsys.readouterr().out
    assert cli_main(["data", "prepare", "--text", str(tmp_path / "nope"), "--out", str(out)]) == 2
    assert "neither a file nor a folder" in capsys.readouterr().err


def test_tokenizers_encode_and_decode():
    text = "x = 'ünïcode ✓'\n"
    b = Tokenizer.byte()
    assert b.decode(b.encode(text)) == text and len(b.encode(text)) == len(text.encode())
    c = Tokenizer.char_from_text(set(text))
    assert c.decode(c.encode(text)) == text and c.vocab_size == len(set(text))
    with pytest.raises(DataError, match=r"character 'z' is not in the corpus vocabulary"):
        c.encode("z")


def test_window_rule_is_the_same_for_every_rank_count():
    s = WindowSampler(1000, 12, seed=5, tokens_per_window=16)
    for step in range(4):
        g = s.global_indices(step)
        assert g.min() >= 0 and g.max() < 1000
        for n in (1, 2, 3, 5):
            parts = [s.local_indices(step, n, r) for r in range(n)]
            np.testing.assert_array_equal(np.concatenate([p for p, _ in parts]), g)
            assert {c for _, c in parts} == {12}
        # a pure function of (seed, step, sample index)
        np.testing.assert_array_equal(window_starts(5, step, np.array([7, 3]), 1000), g[[7, 3]])
    assert not np.array_equal(s.global_indices(0), s.global_indices(1))
    assert not np.array_equal(s.global_indices(0), WindowSampler(1000, 12, 6, 16).global_indices(0))
    assert s.batches_per_epoch == (1000 + 16) // (12 * 16)
    # spread: every start is about equally likely
    hits = np.bincount(window_starts(0, 3, np.arange(200_000), 10), minlength=10)
    assert hits.min() > 19_000 and hits.max() < 21_000


@pytest.fixture
def corpus(textdir, tmp_path):
    path = tmp_path / "corpus.h5"
    prepare_corpus(collect_files([textdir], "*.py"), path, "byte", val_fraction=0.3, seed=1)
    return path


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_corpus_windows_are_contiguous_token_runs(corpus, storage):
    T = 16
    ds = load_dataset(DataConfig(kind="tokens", path=str(corpus), storage=storage, eval_windows=5),
                      "sequence", block_size=T)
    with h5py.File(corpus, "r") as f:
        train, val = f["train/tokens"][()].astype(np.int64), f["val/tokens"][()].astype(np.int64)
    assert ds.n_train == len(train) - T and ds.x_train.shape == (len(train) - T, T) and ds.n_classes == 256
    starts = np.array([0, 5, len(train) - T - 1, 5])
    x, y = read_pairs(ds, starts)
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(x[i], train[s:s + T])
        np.testing.assert_array_equal(y[i], train[s + 1:s + T + 1])
    np.testing.assert_array_equal(ds.x_train[starts], x)
    ev = eval_starts(len(val), T, 5)
    assert ds.n_test == len(ev) == 5 and ev[0] == 0 and np.all(np.diff(ev) >= T) and ev[-1] + T < len(val)
    np.testing.assert_array_equal(ds.y_test[1:3], np.stack([val[s + 1:s + T + 1] for s in ev[1:3]]))
    assert len(eval_starts(len(val), T, 0)) == (len(val) - 1) // T  # 0: every non-overlapping window


def test_corpus_errors_name_the_key(corpus, tmp_path):
    with pytest.raises(DataError, match=r"model\.block_size: the train split of .* holds [\d,]+ tokens, "
                                        r"fewer than one window of block_size \+ 1 = 5001: lower model\.block_size"):
        load_dataset(DataConfig(kind="tokens", path=str(corpus)), "sequence", block_size=5000)
    prepare_corpus(collect_files([corpus.parent / "src" / "a.py"]), tmp_path / "tiny_val.h5", val_fraction=0.01)
    with pytest.raises(DataError, match=r"model\.block_size: the val split of .* holds 9 tokens, .* "
                                        r"= 17: .*larger --val-fraction"):
        load_dataset(DataConfig(kind="tokens", path=str(tmp_path / "tiny_val.h5")), "sequence", block_size=16)
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(DataError, match=r"data\.path: .*plain\.h5 is not a token corpus .*hpcdp data prepare"):
        load_dataset(DataConfig(kind="tokens", path=str(tmp_path / "plain.h5")), "sequence", block_size=8)
    with pytest.raises(DataError, match=r"data\.path: file not found"):
        load_dataset(DataConfig(kind="tokens", path=str(tmp_path / "none.h5")), "sequence", block_size=8)
    # the model's vocabulary must cover the corpus's
    from hpcdp.train import check_model_fits_data
    ds = load_dataset(DataConfig(kind="tokens", path=str(corpus)), "sequence", block_size=8)
    cfg = load_config(None, ["model.kind=gpt", "model.vocab_size=128", "model.block_size=8",
                             "data.kind=tokens", f'data.path="{corpus}"'])
    with pytest.raises(ValueError, match=r"model\.vocab_size: corpus\.h5 uses token ids up to 255; needs >= 256"):
        check_model_fits_data(cfg.model, ds)
    # a damaged corpus: an id outside its vocabulary
    del ds
    import gc
    gc.collect()  # the views held the file open
    with h5py.File(corpus, "r+") as f:
        f["train/tokens"][3] = 255
        del f["vocab"]
        f["vocab"] = np.arange(200)
        f.attrs["vocab_size"] = 200
    with pytest.raises(DataError, match=r"holds token id 255, outside its vocabulary of 200"):
        load_dataset(DataConfig(kind="tokens", path=str(corpus)), "sequence", block_size=8)


def test_next_token_greedy_top_k_and_temperature():
    logits = np.array([0.1, 3.0, 2.9, -1.0])
    assert next_token(logits, 0.0, 0, None) == 1
    rng = np.random.default_rng(0)
    assert {next_token(logits, 1.0, 1, rng) for _ in range(50)} == {1}  # top-1 = greedy
    assert {next_token(logits, 1.0, 2, rng) for _ in range(200)} == {1, 2}
    draws = [next_token(logits, 1.0, 0, np.random.default_rng(s)) for s in range(4000)]
    p = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 4000, p, atol=0.03)


def test_generate_crops_the_context_and_is_deterministic():
    from hpcdp.nn.gpt import GPT
    model = GPT(vocab_size=11, block_size=4, n_layer=1, n_head=1, n_embd=8, seed=0)
    out = generate(model, [1, 2], 9, temperature=1.0, seed=3, vocab_limit=7)
    assert out.shape == (11,) and out[:2].tolist() == [1, 2] and out.max() < 7
    np.testing.assert_array_equal(out, generate(model, [1, 2], 9, temperature=1.0, seed=3, vocab_limit=7))
    greedy = generate(model, [1, 2], 6, temperature=0.0)
    # greedy = argmax of the logits of the last (at most block_size) tokens, step by step
    from hpcdp.autograd import Tensor, no_grad
    ids = [1, 2]
    with no_grad():
        for _ in range(6):
            ids.append(int(model(Tensor(np.array([ids[-4:]]))).numpy()[0, -1].argmax()))
    assert greedy.tolist() == ids


def test_gpt_trains_on_a_corpus_and_writes_a_sample(corpus, tmp_path):
    from hpcdp.train import run_training
    out = tmp_path / "run"
    cfg = load_config(None, [
        "model.kind=gpt", "model.vocab_size=256", "model.block_size=16", "model.n_layer=1", "model.n_head=2",
        "model.n_embd=16", "data.kind=tokens", f'data.path="{corpus}"', "data.eval_windows=8",
        "train.steps=6", "train.global_batch=4", "optim.kind=adamw", "optim.lr=0.01", f'run.out_dir="{out}"',
        "sample.length=12", 'sample.prompt="def "', "sample.temperature=0"])
    log = io.StringIO()
    res = run_training(cfg, out=log)
    assert res["eval"]["n"] == 8 * 16  # tokens evaluated
    text = (out / "sample.txt").read_text(encoding="utf-8")
    assert text.startswith("def ") and "sample (12 tokens" in log.getvalue()
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "eval" not in r]
    assert len(steps) == 6 and all(s["global_batch"] == 4 for s in steps)
