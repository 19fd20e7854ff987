"""The transformers side of tests/hf (runs in .venv-hf: PyTorch CPU + transformers,
never hpcdp). One process per call, so torch is imported once for many folders.

    python oracle.py logits JOBS.json    JOBS: [{"folder", "ids" (.npy), "out" (.npy), "dtype"}]
    python oracle.py make SPEC.json      SPEC: {"folder", "config": {GPT2Config kwargs}, "seed", "ids", "out"}
    python oracle.py tokenize SPEC.json  SPEC: {"tokenizer" (tokenizer.json), "folder" (an export),
                                                "texts": [file], "out" (.json)}
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def logits_of(model, ids_path, dtype):
    ids = torch.from_numpy(np.load(ids_path).astype(np.int64))
    model = model.to(DTYPES[dtype]).eval()
    with torch.no_grad():
        return model(ids).logits.numpy()


def cmd_logits(jobs):
    for job in jobs:
        # eager attention: the textbook softmax(q k^T / sqrt(d)) path
        model = GPT2LMHeadModel.from_pretrained(job["folder"], dtype=DTYPES[job["dtype"]],
                                                attn_implementation="eager")
        assert model.config.tie_word_embeddings == job["tied"], model.config
        if job["tied"]:
            assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        np.save(job["out"], logits_of(model, job["ids"], job["dtype"]))
        if "special_out" in job:  # the special token ids transformers reads, and generation's
            g = model.generation_config
            json.dump({"bos": model.config.bos_token_id, "eos": model.config.eos_token_id,
                       "gen_bos": g.bos_token_id, "gen_eos": g.eos_token_id}, open(job["special_out"], "w"))


def cmd_make(spec):
    torch.manual_seed(spec["seed"])
    model = GPT2LMHeadModel(GPT2Config(**spec["config"], attn_implementation="eager"))
    with torch.no_grad():  # not only GPT-2's init: biases and LayerNorms random too, so each is checked
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(spec["folder"])  # safetensors
    np.save(spec["out"], logits_of(model, spec["ids"], "float64"))


def cmd_tokenize(spec):
    tok = PreTrainedTokenizerFast(tokenizer_file=spec["tokenizer"])
    auto = AutoTokenizer.from_pretrained(spec["folder"])  # the export's tokenizer_config.json
    out = []
    for path in spec["texts"]:
        text = open(path, encoding="utf-8").read()
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert auto(text, add_special_tokens=False)["input_ids"] == ids
        out.append({"ids": ids, "roundtrip": tok.decode(ids, clean_up_tokenization_spaces=False) == text
                    and auto.decode(ids) == text, "eos": auto.eos_token_id})
    json.dump(out, open(spec["out"], "w"))


if __name__ == "__main__":
    {"logits": cmd_logits, "make": cmd_make, "tokenize": cmd_tokenize}[sys.argv[1]](
        json.load(open(sys.argv[2])))
