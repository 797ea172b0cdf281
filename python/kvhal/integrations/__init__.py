"""Integrations of kvhal with model frameworks.

transformers: a Hugging Face transformers causal LM generating with its KV pages in kvhal (kvhal.integrations.transformers).
Each integration imports its framework only when it is used, so importing this package needs none of them.
"""
