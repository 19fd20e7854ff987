"""Checkpoints and other tools, without training.

- inspect.py     verify, export, digests, summaries (`hpcdp ckpt`, hpcdp/commands/ckpt.py)
- export.py      `hpcdp ckpt export --format h5|npz|safetensors|hf-gpt2`
- hf_gpt2.py     transformers' GPT2LMHeadModel layout, both ways
- init_from.py   `model.init_from`: weights made elsewhere, through the restore targets
- folder.py      a model folder's files: inside it, regular files, opened without blocking
"""
