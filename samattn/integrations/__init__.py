"""Integrations of samattn with other libraries; each imports its library only when used.

- ``samattn.integrations.transformers``: samattn as an attention implementation of
  Hugging Face transformers (``register()``, then ``attn_implementation="samattn"``).
"""
