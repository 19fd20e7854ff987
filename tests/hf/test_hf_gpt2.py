"""The proof against the real thing: transformers' GPT2LMHeadModel (PyTorch CPU, in
its own venv) and hpcdp compute the same logits from the same weights, both ways.

- hpcdp -> transformers: a trained GPT, exported with ``hpcdp ckpt export --format
  hf-gpt2``, loads with ``GPT2LMHeadModel.from_pretrained(folder)`` and its logits on
  a batch equal hpcdp's forward (float64 to 1e-10, float32 to 1e-5 relative), tied
  and untied head, both GELUs;
- transformers -> hpcdp: a GPT2LMHeadModel made from a config (random weights,
  ``save_pretrained``) is imported with ``model.init_from`` and hpcdp's logits equal
  its logits; 20 steps of DDP on 2 ranks train from it, ZeRO-3 (each rank reading
  its shard) gives the same losses, and the trained model goes back to transformers
  with equal logits;
- a tokenizer trained with ``hpcdp data train-tokenizer`` (the tokenizers library)
  round-trips the held-out files in transformers too, with the same ids as hpcdp's
  corpus, and the GPT trained on it exports with its tokenizer.json."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from interop_jobs import SOURCES, byte_corpus, hpcdp, job_text, ok

# minutes on a loaded machine: several trainings, mpiexec jobs and torch start-ups each
pytestmark = pytest.mark.timeout(900)

IDS = np.random.default_rng(0).integers(0, 256, size=(3, 16))
TOL = {"float64": 1e-10, "float32": 1e-5}


def rel_err(a, b) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b)) / np.max(np.abs(b)))


def hpcdp_logits(path, ids, *sets) -> np.ndarray:
    from hpcdp.io.restore.weights import model_from_checkpoint
    model = model_from_checkpoint(str(path), sets)[2]
    return model(ids).numpy()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return byte_corpus(tmp_path_factory.mktemp("hf-corpus"))


# tied/untied x tanh/exact x float64/float32, each pair of forms at least once
FORMS = [(True, "tanh", "float64"), (False, "exact", "float64"), (True, "exact", "float32"),
         (False, "tanh", "float32")]


def test_exported_gpt_loads_in_transformers_with_equal_logits(tmp_path, corpus, oracle):
    shutil.copy(corpus, tmp_path / "corpus.h5")
    np.save(tmp_path / "ids.npy", IDS)
    jobs, ours = [], {}
    for i, (tied, gelu, dtype) in enumerate(FORMS):
        (tmp_path / f"job{i}.toml").write_text(job_text(out=f"run{i}", ckpt=f"ck{i}", tied=tied, gelu=gelu,
                                                        dtype=dtype))
        ok(hpcdp(tmp_path, "train", "--config", f"job{i}.toml"))
        ok(hpcdp(tmp_path, "ckpt", "export", f"ck{i}/step-00000002", f"hf{i}", "--format", "hf-gpt2"))
        ours[i] = hpcdp_logits(tmp_path / f"ck{i}" / "step-00000002", IDS)
        jobs.append({"folder": f"hf{i}", "ids": "ids.npy", "out": f"theirs{i}.npy", "dtype": dtype, "tied": tied,
                     "special_out": f"special{i}.json"})
    oracle("logits", jobs, tmp_path)
    for i in range(len(FORMS)):  # a byte corpus has no end-of-text token: null, not GPT-2's 50256
        assert json.loads((tmp_path / f"special{i}.json").read_text()) == {
            "bos": None, "eos": None, "gen_bos": None, "gen_eos": None}
    for i, (tied, gelu, dtype) in enumerate(FORMS):
        theirs = np.load(tmp_path / f"theirs{i}.npy")
        assert theirs.shape == ours[i].shape == (3, 16, 256)
        assert theirs.dtype == np.dtype(dtype) and ours[i].dtype == np.dtype(dtype)
        err = rel_err(ours[i], theirs)
        assert err <= TOL[dtype], (tied, gelu, dtype, err)
        assert err > 0 or dtype == "float64"  # two implementations: float32 rounds differently


def _losses(run) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if "step" in x and "loss" in x]


def test_transformers_model_imports_trains_under_ddp_and_zero3_and_goes_back(tmp_path, corpus, oracle):
    shutil.copy(corpus, tmp_path / "corpus.h5")
    np.save(tmp_path / "ids.npy", IDS)
    config = {"vocab_size": 256, "n_positions": 16, "n_embd": 16, "n_layer": 2, "n_head": 2,
              "activation_function": "gelu_new", "tie_word_embeddings": False, "bos_token_id": None,
              "eos_token_id": None}
    oracle("make", {"folder": "gpt2", "config": config, "seed": 3, "ids": "ids.npy", "out": "theirs.npy"},
           tmp_path)
    (tmp_path / "job.toml").write_text(job_text(tied=False, dtype="float64", steps=20))

    from hpcdp.config import load_config
    from hpcdp.io.format.names import PARAM
    from hpcdp.io.interop.init_from import init_from
    from hpcdp.io.protocol import Piece
    from hpcdp.nn import build_model

    class Whole:  # one process holding every parameter, as a replica's targets are
        def checkpoint_targets(self):
            return [Piece(PARAM, 0, model.flat.data)]

        def checkpoint_restored(self):
            pass

    cfg = load_config(tmp_path / "job.toml", ['model.init_from="gpt2"'])
    model = build_model(cfg.model, dtype="float64", device="cpu", storage=("data",))
    init_from(tmp_path / "gpt2", Whole(), model.flat, cfg.model, None)
    model.eval()
    theirs = np.load(tmp_path / "theirs.npy")
    assert rel_err(model(IDS).numpy(), theirs) <= 1e-10

    runs = {}
    for name, sets in (("ddp", ['parallel.strategy="ddp"']),
                       ("zero3", ['parallel.strategy="zero"', "parallel.zero.stage=3"])):
        args = ["train", "--config", "job.toml", "--set", 'model.init_from="gpt2"', "--set", f'run.out_dir="{name}"',
                "--set", f'checkpoint.dir="ck-{name}"']
        for s in sets:
            args += ["--set", s]
        out = ok(hpcdp(tmp_path, *args, ranks=2))
        assert "model.init_from: gpt2 (hf-gpt2)" in out and "optimizer state fresh" in out
        runs[name] = _losses(tmp_path / name)
    assert len(runs["ddp"]) == 20 and runs["ddp"][-1] < runs["ddp"][0]  # it trained
    np.testing.assert_allclose(runs["zero3"], runs["ddp"], rtol=1e-9)  # the shards were the same weights

    # and back: the DDP run's last checkpoint in transformers
    ok(hpcdp(tmp_path, "ckpt", "export", "ck-ddp/step-00000020", "back", "--format", "hf-gpt2"))
    oracle("logits", [{"folder": "back", "ids": "ids.npy", "out": "back.npy", "dtype": "float64",
                       "tied": False}], tmp_path)
    back = np.load(tmp_path / "back.npy")
    assert rel_err(hpcdp_logits(tmp_path / "ck-ddp" / "step-00000020", IDS), back) <= 1e-10
    assert rel_err(back, theirs) > 1e-3  # 20 steps changed the model


def test_bpe_tokenizer_and_its_gpt_in_transformers(tmp_path, oracle):
    files = sorted(SOURCES.rglob("*.py"))  # io/ has sub-folders: every file under it
    (tmp_path / "train").mkdir(), (tmp_path / "held").mkdir()
    for i, f in enumerate(files):
        name = "_".join(f.relative_to(SOURCES).parts)  # two folders' __init__.py stay apart
        shutil.copy(f, tmp_path / ("held" if i % 9 == 4 else "train") / name)
    ok(hpcdp(tmp_path, "data", "train-tokenizer", "--text", "train", "--vocab-size", 400, "--out", "tok.json"))
    ok(hpcdp(tmp_path, "data", "prepare", "--text", "train", "--tokenizer", "tok.json", "--out", "corpus.h5"))
    (tmp_path / "job.toml").write_text(job_text(vocab=400, steps=2))
    ok(hpcdp(tmp_path, "train", "--config", "job.toml"))
    ok(hpcdp(tmp_path, "ckpt", "export", "ck/step-00000002", "hf", "--format", "hf-gpt2"))
    held = sorted(str(p) for p in (tmp_path / "held").iterdir())
    ids = np.random.default_rng(1).integers(0, 400, size=(2, 16))
    np.save(tmp_path / "ids.npy", ids)
    oracle("tokenize", {"tokenizer": "hf/tokenizer.json", "folder": "hf", "texts": held, "out": "tok-out.json"},
           tmp_path)
    oracle("logits", [{"folder": "hf", "ids": "ids.npy", "out": "theirs.npy", "dtype": "float32", "tied": True}],
           tmp_path)

    from hpcdp.data.bpe import HFTokenizer
    tok = HFTokenizer.from_file(tmp_path / "tok.json")
    result = json.loads((tmp_path / "tok-out.json").read_text())
    assert len(result) == len(held) >= 2
    for path, r in zip(held, result):
        text = open(path, encoding="utf-8").read()
        assert r["roundtrip"]  # decode(encode(text)) == text in transformers
        assert r["eos"] == tok.token_id("<|endoftext|>") == 0
        assert r["ids"] == tok.encode(text).tolist()  # the ids hpcdp's corpus holds
        assert tok.decode(r["ids"]) == text
    assert rel_err(hpcdp_logits(tmp_path / "ck" / "step-00000002", ids), np.load(tmp_path / "theirs.npy")) <= 1e-5
    sample = ok(hpcdp(tmp_path, "sample", "--resume", "ck", "--length", 10))
    assert sample.startswith("def ")
