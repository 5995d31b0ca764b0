"""Model families as pure functions of parameter pytrees, their quantized copies and their files.

Holds the parameter table and `ModelConfig` (`layout`), the Llama / Qwen decoder (`model`), its
KV cache (`kv_cache`) and prefill / decode steps (`decode`), quantized arrays (`qarray`, `fp8`,
`fp4`: the rollout copy), Hugging Face / GGUF checkpoint I/O and config translation
(`pretrained`, `hf_config`), LoRA adapters and their PEFT files (`lora`, `peft_io`), and the
LLaDA masked-diffusion model and checkpoint format (`llada/`). May import `ais_jax.core` only:
models know nothing of the method, training or runs.
"""
