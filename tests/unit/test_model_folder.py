"""Model folders someone else made (``model.init_from``) and stored metadata that lies
(``hpcdp ckpt``): every hostile or broken case is one line naming the file and the
tensor or key, never a silent outside read, a hang, NaN weights or a raw exception.

Real files throughout: indexes whose shard names leave the folder (``../``, absolute),
links out of it (and the two kinds of link that are allowed), a real FIFO (os.mkfifo)
in every place a model file can be, with a real ``hpcdp train`` that must end in one
line instead of hanging, NaN/Inf/1e300 tensors, config.json / index / stored configs
with wrong types, and a checkpoint index whose attributes were edited. The GPT-2
folders are written from a fresh model (no training), so the file costs a few
seconds plus two short ``hpcdp train`` runs that stop in setup.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from hpcdp.config import dump_toml, load_config
from hpcdp.io.errors import CheckpointError
from hpcdp.io.format.checksum import sha256_file
from hpcdp.io.format.commit import marker_text
from hpcdp.io.format.index import read_index
from hpcdp.io.format.names import INDEX_FILE, MARKER_FILE, PARAM
from hpcdp.io.interop.export import hf_arrays
from hpcdp.io.interop.hf_gpt2 import hf_config
from hpcdp.io.interop.init_from import init_from
from hpcdp.io.interop.inspect import summary, verify
from hpcdp.io.protocol import Piece
from hpcdp.io.restore.weights import checkpoint_config
from hpcdp.nn import build_model

sys.path.insert(0, str(Path(__file__).parent))
from hpcdp.launch import THREAD_ENV  # noqa: E402
from interop_jobs import ROOT, byte_corpus, hpcdp, job_text  # noqa: E402

WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"


class Targets:
    def __init__(self, pieces):
        self.pieces = pieces

    def checkpoint_targets(self):
        return self.pieces

    def checkpoint_restored(self):
        pass


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A job (untied head: the transposed tensor too) and a GPT-2 folder ``hf`` of a
    fresh model's weights, as save_pretrained lays them out."""
    d = tmp_path_factory.mktemp("folders")
    (d / "job.toml").write_text(job_text(tied=False, gelu="exact"))
    cfg = load_config(d / "job.toml")
    model = build_model(cfg.model, dtype="float32", device="cpu", storage=("data",))
    arrays = hf_arrays({n: p.data for n, p in model.flat.params.items()}, tied=False)
    (d / "hf").mkdir()
    save_file(arrays, str(d / "hf" / WEIGHTS), metadata={"format": "pt"})
    (d / "hf" / "config.json").write_text(json.dumps(hf_config(cfg.model, dtype="float32")))
    return d


def load(made, source, *sets):
    cfg = load_config(made / "job.toml", sets)
    model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu", storage=("data",))
    init_from(source, Targets([Piece(PARAM, 0, model.flat.data)]), model.flat, cfg.model, None)
    return model.flat.data


def copy_of(made, tmp_path, name="m") -> Path:
    out = tmp_path / name
    shutil.copytree(made / "hf", out)
    return out


def sharded(made, folder: Path, second: str) -> None:
    """``folder``'s weights in two shards, the index naming the second ``second``."""
    arrays = load_file(str(made / "hf" / WEIGHTS))
    keys = sorted(arrays)
    (folder / WEIGHTS).unlink()
    save_file({k: arrays[k] for k in keys[:5]}, str(folder / "model-00001-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in keys[:5]}
    weight_map.update({k: second for k in keys[5:]})
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {k: arrays[k] for k in keys[5:]}


def refused(made, source, *sets) -> str:
    with pytest.raises(CheckpointError) as e:
        load(made, source, *sets)
    text = str(e.value)
    assert "\n" not in text and "Error:" not in text, text  # one line, no raw exception
    return text


# Run in a child process: opening a FIFO blocks inside the safetensors package with the
# GIL held, so no thread of the test process could even notice; the child is killed
# at the timeout (which only guards the test: a fixed build answers at once).
CHILD = """
import json, sys
from hpcdp.config import load_config
from hpcdp.io.format.names import PARAM
from hpcdp.io.interop.export import check_export_target
from hpcdp.io.interop.init_from import init_from
from hpcdp.io.protocol import Piece
from hpcdp.nn import build_model

class Targets:
    def __init__(self, pieces):
        self.pieces = pieces
    def checkpoint_targets(self):
        return self.pieces
    def checkpoint_restored(self):
        pass

job, cases = sys.argv[1], json.loads(sys.argv[2])
cfg = load_config(job)
for how, source in cases:
    try:
        if how == "export":
            check_export_target(__import__("pathlib").Path(source), False)
        else:
            model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu", storage=("data",))
            init_from(source, Targets([Piece(PARAM, 0, model.flat.data)]), model.flat, cfg.model, None)
        print("no error", flush=True)
    except Exception as e:
        print(f"{type(e).__name__}: {e}".replace(chr(10), " | "), flush=True)
"""


def outcomes(made, cases) -> list[str]:
    """One line per ``(how, source)`` case, from a child process."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(made / "job.toml"), json.dumps(cases)],
                          env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


# -- 38.3: names and links that leave the folder, FIFOs ---------------------------

@pytest.mark.parametrize("name", ["../outside.safetensors", "ABSOLUTE", "sub/../../outside.safetensors"])
def test_an_index_naming_a_file_outside_the_folder_is_refused(made, tmp_path, name):
    folder = copy_of(made, tmp_path)
    rest = sharded(made, folder, str(tmp_path / "outside.safetensors") if name == "ABSOLUTE" else name)
    save_file(rest, str(tmp_path / "outside.safetensors"))  # a readable file is there: it must not be read
    shown = str(tmp_path / "outside.safetensors") if name == "ABSOLUTE" else name
    text = refused(made, folder)
    assert text.startswith(f"model.init_from: {folder}: {INDEX}'s file of transformer.")
    assert f"is {shown!r}, a file outside the folder" in text and "use another copy of the model" in text


def test_a_sharded_folder_inside_itself_loads(made, tmp_path):
    folder = copy_of(made, tmp_path)
    sharded(made, folder, "model-00002-of-00002.safetensors")
    save_file(load_file(str(made / "hf" / WEIGHTS)), str(folder / "model-00002-of-00002.safetensors"))
    np.testing.assert_array_equal(load(made, folder), load(made, made / "hf"))


def test_a_link_out_of_the_folder_is_refused(made, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(made / "hf" / WEIGHTS, elsewhere / WEIGHTS)
    folder = copy_of(made, tmp_path)
    (folder / WEIGHTS).unlink()
    (folder / WEIGHTS).symlink_to(Path("..") / "elsewhere" / WEIGHTS)
    text = refused(made, folder)
    assert text == (f"model.init_from: {folder / WEIGHTS} is a link to {(elsewhere / WEIGHTS).resolve()}, "
                    "outside the folder: a model's files must be inside its folder; copy the file into the folder")
    (folder / WEIGHTS).unlink()  # config.json too
    shutil.copy(made / "hf" / WEIGHTS, folder / WEIGHTS)
    shutil.move(folder / "config.json", elsewhere / "config.json")
    (folder / "config.json").symlink_to(elsewhere / "config.json")
    assert "config.json is a link to" in refused(made, folder)


def test_links_within_the_folder_and_the_hub_cache_layout_load(made, tmp_path):
    """Allowed: a link whose target stays in the folder, and the Hugging Face hub
    cache (models--X/snapshots/REV/* -> ../../blobs/*)."""
    want = load(made, made / "hf")
    folder = copy_of(made, tmp_path)
    (folder / "blobs").mkdir()
    shutil.move(folder / WEIGHTS, folder / "blobs" / "abc")
    (folder / WEIGHTS).symlink_to(Path("blobs") / "abc")
    np.testing.assert_array_equal(load(made, folder), want)
    repo = tmp_path / "hub" / "models--someone--tiny"
    snap, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for name, blob in ((WEIGHTS, "f00d"), ("config.json", "beef")):
        shutil.copy(made / "hf" / name, blobs / blob)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / blob)
    np.testing.assert_array_equal(load(made, snap), want)


def test_a_fifo_anywhere_is_refused_without_blocking(made, tmp_path):
    """A real FIFO as a shard, as model.safetensors, config.json, tokenizer.json and
    as the init_from file itself: refused at once, naming it."""
    cases = []
    shard = copy_of(made, tmp_path, "shard")
    sharded(made, shard, "model-00002-of-00002.safetensors")
    cases.append((shard, shard / "model-00002-of-00002.safetensors"))
    for name in (WEIGHTS, "config.json", "tokenizer.json"):
        folder = copy_of(made, tmp_path, name)
        if (folder / name).exists():
            (folder / name).unlink()
        cases.append((folder, folder / name))
    cases.append((tmp_path / "w.safetensors", tmp_path / "w.safetensors"))
    for _, fifo in cases:
        os.mkfifo(fifo)
    got = outcomes(made, [("load", str(source)) for source, _ in cases])
    assert got == [f"CheckpointError: model.init_from: {fifo} is a FIFO (named pipe), not a regular file: a "
                   "model's files must be regular files (reading a FIFO or device would block the job or read "
                   "without end); put the file itself there" for _, fifo in cases]


def test_an_export_into_a_folder_with_a_fifo_does_not_block(made, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / WEIGHTS)
    [got] = outcomes(made, [("export", str(out))])
    assert got.startswith(f"CheckpointError: export --format hf-gpt2: {out} is a folder that is not an earlier "
                          "export"), got


@pytest.fixture(scope="module")
def corpus(made):
    byte_corpus(made)
    return made


def test_train_with_a_fifo_shard_ends_in_one_line(corpus, tmp_path):
    """The real command: before, every rank blocked in open() and SIGTERM did not end
    it; now status 2 and one line, at once (the timeout only guards the test)."""
    folder = copy_of(corpus, tmp_path, "fifo-model")
    sharded(corpus, folder, "model-00002-of-00002.safetensors")
    os.mkfifo(folder / "model-00002-of-00002.safetensors")
    proc = hpcdp(corpus, "train", "--config", "job.toml", "--set", f'model.init_from="{folder}"',
                 "--set", f'run.out_dir="{tmp_path / "run"}"', "--set", 'checkpoint.dir=""', timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"hpcdp: error: model.init_from: {folder}/model-00002-of-00002.safetensors is a FIFO (named pipe), not a "
        "regular file: a model's files must be regular files (reading a FIFO or device would block the job or "
        "read without end); put the file itself there"]


# -- 38.7: imported values ---------------------------------------------------------

def with_value(made, tmp_path, key, value, dtype=None) -> Path:
    folder = copy_of(made, tmp_path, f"v-{key}-{value}")
    arrays = load_file(str(folder / WEIGHTS))
    if dtype is not None:
        arrays = {k: v.astype(dtype) for k, v in arrays.items()}
    arrays[key].reshape(-1)[7] = value
    save_file(arrays, str(folder / WEIGHTS))
    return folder


@pytest.mark.parametrize("key,value", [("transformer.h.0.mlp.c_fc.weight", np.nan),
                                       ("transformer.wpe.weight", -np.inf),
                                       ("lm_head.weight", np.inf)])  # the head: transposed, read whole
def test_non_finite_imported_weights_are_refused_by_tensor(made, tmp_path, key, value):
    folder = with_value(made, tmp_path, key, value)
    text = refused(made, folder)
    assert text == (f"model.init_from: {folder / WEIGHTS}: tensor {key} holds 1 non-finite value(s) ({value} at "
                    "element 7): these weights are "
                    "broken (a diverged or damaged model) and cannot train; use other weights")


def test_float64_values_beyond_float32_are_refused_in_a_float32_run(made, tmp_path):
    folder = with_value(made, tmp_path, "transformer.h.1.attn.c_proj.weight", 1e300, dtype=np.float64)
    with np.errstate(over="raise"):  # and no overflow happens on the way
        text = refused(made, folder)
    assert text == (f"model.init_from: {folder / WEIGHTS}: tensor transformer.h.1.attn.c_proj.weight holds 1 "
                    "value(s) beyond float32's range (1e+300 at element 7): they would become inf in run.dtype = "
                    "\"float32\"; set run.dtype = \"float64\" or use other weights")
    got = load(made, folder, 'run.dtype="float64"')  # float64 keeps them
    assert np.isfinite(got).all() and got.max() == 1e300


def test_train_with_nan_weights_and_skip_stops_in_one_line(corpus, tmp_path):
    """Before: on_nonfinite = "skip" trained to exit 0 and saved NaN weights."""
    folder = with_value(corpus, tmp_path, "transformer.ln_f.weight", np.nan)
    proc = hpcdp(corpus, "train", "--config", "job.toml", "--set", f'model.init_from="{folder}"',
                 "--set", 'train.on_nonfinite="skip"', "--set", f'run.out_dir="{tmp_path / "run"}"',
                 "--set", f'checkpoint.dir="{tmp_path / "ck"}"', timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"hpcdp: error: model.init_from: {folder / WEIGHTS}: tensor transformer.ln_f.weight holds 1 non-finite "
        "value(s) (nan at element 7): these weights are broken (a diverged or damaged model) and cannot train; "
        "use other weights"]
    assert not list((tmp_path / "ck").glob("step-*"))  # no checkpoint of NaN weights


# -- 38.9: types of config.json, the index, stored configs ---------------------------

@pytest.mark.parametrize("key,value,want", [
    ("n_layer", "two", 'n_layer is "two": expected a positive integer'),
    ("n_layer", -2, "n_layer is -2: expected a positive integer"),
    ("n_layer", True, "n_layer is true: expected a positive integer"),
    ("n_embd", 16.9, "n_embd is 16.9: expected a positive integer"),
    ("n_inner", "64", 'n_inner is "64": expected a positive integer or null'),
    ("tie_word_embeddings", "false", 'tie_word_embeddings is "false": expected true or false'),
    ("scale_attn_weights", "yes", 'scale_attn_weights is "yes": expected true or false'),
    ("activation_function", ["gelu"], 'activation_function is ["gelu"]: expected a string'),
    ("model_type", [], "model_type is []: expected a string"),
    ("layer_norm_epsilon", "x", 'layer_norm_epsilon is "x": expected a positive number'),
    (None, [1], "it holds a list, not a JSON object"),
])
def test_config_json_types_are_checked_by_key(made, tmp_path, key, value, want):
    folder = copy_of(made, tmp_path)
    conf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(value if key is None else {**conf, key: value}))
    assert refused(made, folder) == (
        f"model.init_from: {folder / 'config.json'}: {want}: the file is damaged or not a GPT-2 config.json "
        "(transformers writes these types): fix it, or save the model again (save_pretrained)")


@pytest.mark.parametrize("index,want", [
    ([1], "expected a JSON object whose weight_map maps each tensor to its file, found a JSON list"),
    ({}, "expected a JSON object whose weight_map maps each tensor to its file, found no weight_map"),
    ({"weight_map": [1]}, "expected a JSON object whose weight_map maps each tensor to its file, "
                          "found weight_map is [1]"),
    ({"weight_map": {"transformer.wte.weight": 3}}, "INDEX's file of transformer.wte.weight is 3, not a file name"),
    ("MISMAP", "model-00001-of-00002.safetensors: tensor transformer.wte.weight is not in it, though INDEX says "
               "so: the folder is damaged"),
])
def test_a_damaged_index_is_one_line(made, tmp_path, index, want):
    folder = copy_of(made, tmp_path)
    sharded(made, folder, "model-00002-of-00002.safetensors")
    if index == "MISMAP":  # the second shard holds wte; the index says the first does
        save_file(load_file(str(made / "hf" / WEIGHTS)), str(folder / "model-00002-of-00002.safetensors"))
        index = json.loads((folder / INDEX).read_text())
        index["weight_map"]["transformer.wte.weight"] = "model-00001-of-00002.safetensors"
    (folder / INDEX).write_text(json.dumps(index))
    text = refused(made, folder)
    assert want.replace("INDEX", INDEX) in text and str(folder) in text, text


def stored_file(made, tmp_path, edit) -> Path:
    """An hpcdp .safetensors file (hpcdp names, the resolved config in its metadata)
    whose stored config ``edit`` changed."""
    cfg = load_config(made / "job.toml")
    model = build_model(cfg.model, dtype="float32", device="cpu", storage=("data",))
    out = tmp_path / "w.safetensors"
    save_file({n: p.data for n, p in model.flat.params.items()}, str(out),
              metadata={"format": "hpcdp", "step": "2", "hpcdp_config": edit(dump_toml(cfg.to_dict()))})
    return out


@pytest.mark.parametrize("edit,want", [
    (lambda t: t.replace("n_layer = 2", 'n_layer = "two"'), "model.n_layer: expected an integer, found 'two'"),
    (lambda t: t.replace("n_layer = 2", "n_layer = -2"), "model.n_layer: -2 is out of range"),
    (lambda t: t.replace("n_embd = 16", "n_embd = 16.9"), "model.n_embd: expected an integer, found 16.9"),
    (lambda t: t.replace("tied_head = false", 'tied_head = "false"'), "model.tied_head: expected true or false"),
    (lambda t: "model = [1]", "model is [1], not a table"),
    (lambda t: t + "\n[[broken", "is not valid TOML"),
])
def test_a_stored_config_is_checked_as_a_config_file(made, tmp_path, edit, want):
    path = stored_file(made, tmp_path, edit)
    text = refused(made, path)
    assert text.startswith(f"model.init_from: {path}: the config in its metadata (hpcdp_config)")
    assert want in text and text.endswith("export it again (hpcdp ckpt export CKPT OUT.safetensors)"), text
    assert "set model." not in text  # never a remedy that sets an invalid value


def test_an_intact_stored_config_still_loads(made, tmp_path):
    path = stored_file(made, tmp_path, lambda t: t)
    with safe_open(str(path), framework="numpy") as f:
        assert "n_layer = 2" in f.metadata()["hpcdp_config"]
    assert load(made, path).size > 0


# -- 38.9: a checkpoint index's attributes ---------------------------------------------

@pytest.fixture
def checkpoint(made, tmp_path):
    from test_ckpt_format import _save_as, _state

    flat, opt = _state()
    ckpt = _save_as(tmp_path / "ck", 3, flat, opt, 1)
    cfg = load_config(made / "job.toml")
    tamper(ckpt, "/", "config", dump_toml(cfg.to_dict()))
    return ckpt


def tamper(ckpt: Path, group: str, key: str, value) -> None:
    """Set an attribute of index.h5 and write the marker again (a tamperer who knows
    the format: the marker's SHA-256 agrees)."""
    with h5py.File(ckpt / INDEX_FILE, "r+") as f:
        f[group].attrs[key] = value
    (ckpt / MARKER_FILE).write_text(marker_text(3, sha256_file(ckpt / INDEX_FILE)))


@pytest.mark.parametrize("group,key,value,want", [
    ("/", "step", "two", "attribute step is 'two', expected an integer"),
    ("/", "world_size", [1, 2], "attribute world_size is array([1, 2]), expected an integer"),
    ("/", "format_version", "two", "attribute format_version is 'two', expected an integer"),
    ("/", "layout", 5, "attribute layout is 5, expected text"),
    ("/state", "optimizer_steps", "four", "/state attribute optimizer_steps is 'four', expected an integer"),
])
def test_index_attributes_have_their_types(checkpoint, group, key, value, want):
    tamper(checkpoint, group, key, value)
    line = (f"{checkpoint / INDEX_FILE}: {want}: the index is damaged or was edited; use an earlier checkpoint")
    for call in (read_index, summary, checkpoint_config):
        with pytest.raises(CheckpointError) as e:
            call(checkpoint)
        assert str(e.value) == line
    assert verify(checkpoint)[0] == [line]


def test_a_stored_config_with_a_bad_value_names_the_checkpoint(checkpoint):
    text = read_index(checkpoint).attrs["config"]
    tamper(checkpoint, "/", "config", text.replace("n_layer = 2", 'n_layer = "two"'))
    with pytest.raises(CheckpointError) as e:
        checkpoint_config(checkpoint)
    assert str(e.value) == (f"checkpoint {checkpoint}: its stored config: model.n_layer: expected an integer, found "
                            "'two': the index is damaged or was edited, or an older hpcdp wrote it; use an earlier "
                            "checkpoint")
    tamper(checkpoint, "/", "config", text)
    assert checkpoint_config(checkpoint, ['model.n_layer=3']).model.n_layer == 3
