"""The Hugging Face ``transformers`` GPT-2 layout (``GPT2LMHeadModel``), both ways.

hpcdp's GPT already uses GPT-2's parameter names and its Conv1D weight layout
``(in, out)``, so the mapping is short:

===============================  ======================================  =========
hpcdp                            GPT2LMHeadModel (model.safetensors)     layout
===============================  ======================================  =========
``wte.weight`` (V, C)            ``transformer.wte.weight`` (V, C)       same
``wpe.weight`` (T, C)            ``transformer.wpe.weight`` (T, C)       same
``ln_f.*``, ``h.N.*``            ``transformer.ln_f.*``, ``transformer.h.N.*``  same
``lm_head.weight`` (C, V)        ``lm_head.weight`` (V, C), untied only  transposed
===============================  ======================================  =========

``config.json`` carries what the weights do not say: ``activation_function``
(``model.gelu = "tanh"`` is ``"gelu_new"``, ``"exact"`` is ``"gelu"``), the
LayerNorm epsilon, ``tie_word_embeddings`` (``model.tied_head``; a tied model
stores no ``lm_head.weight``) and bos/eos token ids (those of the corpus's
tokenizer when it has an end-of-text token, else none: GPT-2's 50256 would not
exist in a small vocabulary). Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import math

from hpcdp.data.bpe import END_OF_TEXT

PREFIX = "transformer."
HEAD = "lm_head.weight"
GELU_TO_HF = {"tanh": "gelu_new", "exact": "gelu"}
# transformers' names of the same two functions (gelu_pytorch_tanh is gelu_new's formula)
HF_TO_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "exact"}
# GPT-2 options hpcdp's GPT does not have, with the value that means "as hpcdp does"
FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}


def hf_name(name: str) -> str:
    """hpcdp parameter name -> GPT2LMHeadModel state-dict key."""
    return name if name == HEAD else PREFIX + name


def hpcdp_name(key: str) -> str | None:
    """GPT2LMHeadModel key -> hpcdp name (None: a buffer hpcdp does not keep: the
    causal-mask ``h.N.attn.bias`` / ``masked_bias`` of old GPT-2 files). Keys
    without the ``transformer.`` prefix (GPT2Model files) are accepted too."""
    name = key[len(PREFIX):] if key.startswith(PREFIX) else key
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "h" and parts[2] == "attn" and parts[3] in ("bias", "masked_bias"):
        return None
    return name


def transposed(name: str) -> bool:
    """Whether the tensor is stored transposed in the Hugging Face layout (nn.Linear's
    (out, in) head; the blocks' Conv1D weights are (in, out) as in hpcdp)."""
    return name == HEAD


def hf_config(model_cfg, *, dtype: str, layer_norm_eps: float = 1e-5,
              end_of_text: int | None = None) -> dict:
    """The ``config.json`` of a GPT2LMHeadModel equal to hpcdp's GPT ``model_cfg``."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": model_cfg.vocab_size, "n_positions": model_cfg.block_size,
        "n_embd": model_cfg.n_embd, "n_layer": model_cfg.n_layer, "n_head": model_cfg.n_head,
        "n_inner": None, "activation_function": GELU_TO_HF[model_cfg.gelu],
        "resid_pdrop": model_cfg.dropout, "embd_pdrop": model_cfg.dropout, "attn_pdrop": model_cfg.dropout,
        "layer_norm_epsilon": layer_norm_eps, "initializer_range": 0.02,
        **FIXED, "reorder_and_upcast_attn": False, "use_cache": True,
        "tie_word_embeddings": bool(model_cfg.tied_head),
        "bos_token_id": end_of_text, "eos_token_id": end_of_text,
        "torch_dtype": dtype, "dtype": dtype,
    }


# config.json's keys hpcdp reads, with the JSON type each must have (transformers
# writes exactly these; a float, a string or a bool where an integer belongs is a
# damaged or hand-edited file, not a value to round or guess)
SIZES = ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_type_problem(conf) -> str | None:
    """The first key of a GPT-2 ``config.json`` whose value has the wrong type or is
    out of range (sizes: positive integers; flags: true/false; names: strings), as
    ``"KEY is VALUE: expected ..."``, or None."""
    def shown(v):
        return json.dumps(v)

    if not isinstance(conf, dict):
        return f"it holds {type(conf).__name__ if not isinstance(conf, list) else 'a list'}, not a JSON object"
    for key in SIZES:
        if key in conf and not (_is_int(conf[key]) and conf[key] >= 1):
            return f"{key} is {shown(conf[key])}: expected a positive integer"
    if conf.get("n_inner") is not None and not (_is_int(conf["n_inner"]) and conf["n_inner"] >= 1):
        return f"n_inner is {shown(conf['n_inner'])}: expected a positive integer or null"
    for key in ("model_type", "activation_function"):
        if key in conf and not isinstance(conf[key], str):
            return f"{key} is {shown(conf[key])}: expected a string"
    eps = conf.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        return f"layer_norm_epsilon is {shown(eps)}: expected a positive number"
    for key in ("tie_word_embeddings", *FIXED):
        if key in conf and not isinstance(conf[key], bool):
            return f"{key} is {shown(conf[key])}: expected true or false"
    return None


def config_mismatch(conf: dict, model_cfg, *, layer_norm_eps: float = 1e-5) -> str | None:
    """The first way a GPT-2 ``config.json`` differs from the ``[model]`` section, as
    one sentence saying what to set, or None when hpcdp's GPT computes the same.
    ``conf`` has passed :func:`config_type_problem`."""
    if conf.get("model_type", "gpt2") != "gpt2":
        return f"model_type is {conf.get('model_type')!r}; only GPT-2 (\"gpt2\") models can be imported"
    pairs = (("vocab_size", "vocab_size"), ("n_positions", "block_size"), ("n_layer", "n_layer"),
             ("n_head", "n_head"), ("n_embd", "n_embd"))
    for hf_key, key in pairs:
        if hf_key not in conf:
            return f"config.json has no {hf_key!r}"
        if conf[hf_key] != getattr(model_cfg, key):
            return (f"{hf_key} is {conf[hf_key]} there, model.{key} = {getattr(model_cfg, key)} here: "
                    f"set model.{key} = {conf[hf_key]}")
    inner = conf.get("n_inner")
    if inner is not None and inner != 4 * model_cfg.n_embd:
        return f"n_inner is {inner}; hpcdp's GPT has an MLP of 4 * n_embd = {4 * model_cfg.n_embd}"
    act = conf.get("activation_function", "gelu_new")
    if act not in HF_TO_GELU:
        return (f"activation_function is {act!r}; hpcdp's GPT has "
                f"{' and '.join(repr(a) for a in HF_TO_GELU)} (model.gelu)")
    if HF_TO_GELU[act] != model_cfg.gelu:
        return f"activation_function is {act!r} there, model.gelu = {model_cfg.gelu!r} here: " \
               f"set model.gelu = \"{HF_TO_GELU[act]}\""
    eps = float(conf.get("layer_norm_epsilon", 1e-5))
    if eps != layer_norm_eps:
        return f"layer_norm_epsilon is {eps:g}; hpcdp's GPT uses {layer_norm_eps:g}"
    tied = conf.get("tie_word_embeddings", True)
    if tied != bool(model_cfg.tied_head):
        return (f"tie_word_embeddings is {str(tied).lower()} there, model.tied_head = "
                f"{str(bool(model_cfg.tied_head)).lower()} here: set model.tied_head = {str(tied).lower()}")
    for key, value in FIXED.items():
        if conf.get(key, value) != value:
            return f"{key} is {conf[key]}; hpcdp's GPT computes only {key} = {str(value).lower()}"
    return None


__all__ = ["hf_name", "hpcdp_name", "transposed", "hf_config", "config_mismatch", "config_type_problem", "END_OF_TEXT", "HEAD"]
