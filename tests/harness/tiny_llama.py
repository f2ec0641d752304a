"""A tiny randomly initialised Llama-3.2-shaped model for fine-tuning tests, as a Hugging Face hub would serve
it, and an alpaca-style dataset. Run with torchtune importable: ``python -m tests.harness.tiny_llama OUT``.

- ``OUT/model``: ``config.json``, ``model.safetensors`` (2 layers, 64 wide, HF key names, tied embeddings),
  ``original/tokenizer.model`` (a tiktoken BPE file: 256 bytes and 64 merges learned on the dataset) and
  ``special_tokens.json`` (Llama 3's special tokens at ids 320-332, so the vocabulary stays at 384);
- ``OUT/dataset/alpaca_tiny.json``: 64 instruction/input/output rows.
"""

from __future__ import annotations

import base64
import collections
import json
import random
import sys
from pathlib import Path

VOCAB = 384
SHAPE = {"vocab_size": VOCAB, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "embed_dim": 64,
         "max_seq_len": 256, "intermediate_dim": 128}
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
           "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
           "<|eot_id|>", "<|python_tag|>", "<|image|>", "<|video|>"]


def dataset(rng: random.Random) -> list[dict[str, str]]:
    words = "the cat dog sat on mat ran fast slow red blue green big small tree house".split()
    rows = []
    for index in range(64):
        a, b = rng.sample(words, 2)
        rows.append({"instruction": f"Repeat the words {a} and {b}.", "input": "" if index % 2 else f"number {index}",
                     "output": f"{a} {b} {a} {b}"})
    return rows


def bpe_ranks(rows: list[dict[str, str]], merges: int = 64) -> dict[bytes, int]:
    """tiktoken's ranks: every byte, then the most frequent adjacent pairs of the dataset, merged greedily."""
    ranks = {bytes([i]): i for i in range(256)}
    corpus = [[bytes([c]) for c in f"{r['instruction']} {r['input']} {r['output']}".encode()] for r in rows]
    for _ in range(merges):
        pairs = collections.Counter(pair for seq in corpus for pair in zip(seq, seq[1:], strict=False))
        if not pairs:
            break
        (x, y), _count = pairs.most_common(1)[0]
        if x + y in ranks:
            break
        ranks[x + y] = len(ranks)
        for k, seq in enumerate(corpus):
            out, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and seq[j] == x and seq[j + 1] == y:
                    out.append(x + y)
                    j += 2
                else:
                    out.append(seq[j])
                    j += 1
            corpus[k] = out
    return ranks


def write(out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from torchtune.models import convert_weights
    from torchtune.models.llama3_2 import llama3_2

    rng = random.Random(0)
    torch.manual_seed(0)
    model_dir, data_dir = out / "model", out / "dataset"
    (model_dir / "original").mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    rows = dataset(rng)
    (data_dir / "alpaca_tiny.json").write_text(json.dumps(rows))
    ranks = bpe_ranks(rows)
    (model_dir / "original" / "tokenizer.model").write_text(
        "".join(f"{base64.b64encode(token).decode()} {rank}\n" for token, rank in ranks.items()))
    special = {name: len(ranks) + i for i, name in enumerate(SPECIAL)}
    (model_dir / "special_tokens.json").write_text(json.dumps(
        {"added_tokens": [{"id": i, "content": name, "special": True} for name, i in special.items()]}))
    model = llama3_2(**SHAPE)
    for _name, param in model.named_parameters():
        if param.dim() > 1:
            torch.nn.init.normal_(param, std=0.02)
    state = convert_weights.tune_to_hf(model.state_dict(), num_heads=4, num_kv_heads=2, dim=64)
    save_file({k: v.contiguous() for k, v in state.items()}, str(model_dir / "model.safetensors"),
              metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": True, "torch_dtype": "float32", "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "bos_token_id": special["<|begin_of_text|>"], "eos_token_id": special["<|end_of_text|>"],
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}}))


#: Trainer v2.3's manifests/base/runtimes/torchtune/llama3_2/llama3_2_1B.yaml, as shipped
TORCHTUNE_RUNTIME = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: torchtune-llama3.2-1b
  labels:
    trainer.kubeflow.org/framework: torchtune
spec:
  mlPolicy:
    numNodes: 1
    torch: {}
  template:
    spec:
      volumeClaimPolicies:
        - templates:
            - metadata:
                name: initializer
              spec:
                accessModes: ["ReadWriteOnce"]
                resources:
                  requests:
                    storage: 20Gi
      replicatedJobs:
        - name: dataset-initializer
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: dataset-initializer
            spec:
              template:
                spec:
                  containers:
                    - name: dataset-initializer
                      image: ghcr.io/kubeflow/trainer/dataset-initializer
                      env:
                        - name: STORAGE_URI
                          value: hf://tatsu-lab/alpaca
                      volumeMounts:
                        - mountPath: /workspace
                          name: initializer
        - name: model-initializer
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: model-initializer
            spec:
              template:
                spec:
                  containers:
                    - name: model-initializer
                      image: ghcr.io/kubeflow/trainer/model-initializer
                      env:
                        - name: STORAGE_URI
                          value: hf://meta-llama/Llama-3.2-1B-Instruct
                      volumeMounts:
                        - name: initializer
                          mountPath: /workspace
        - name: node
          dependsOn:
            - name: dataset-initializer
              status: Complete
            - name: model-initializer
              status: Complete
          template:
            metadata:
              labels:
                trainer.kubeflow.org/trainjob-ancestor-step: trainer
            spec:
              template:
                spec:
                  containers:
                    - name: node
                      image: ghcr.io/kubeflow/trainer/torchtune-trainer
                      command:
                        - tune
                        - run
                        - --rdzv_endpoint=localhost:29500
                        - full_finetune_distributed
                        - --config
                        - llama3_2/1B_full
                        - dataset=torchtune.datasets.instruct_dataset
                        - dataset.source=parquet
                        - dataset.data_dir=/workspace/dataset/data
                        - output_dir=/workspace/output
                        - tokenizer.path=/workspace/model/original/tokenizer.model
                        - checkpointer.checkpoint_dir=/workspace/model
                      resources:
                        limits:
                          nvidia.com/gpu: 2
                      volumeMounts:
                        - mountPath: /workspace
                          name: initializer
"""


#: `tune run` overrides that make Kubeflow's Llama 3.2 1B config this model, on CPU, for a few steps; paths are
#: Kubeflow's (/workspace), the TrainJob's own, as the SDK writes them
TUNE_ARGS = [
    "device=cpu", "dtype=fp32", "compile=False", "log_peak_memory_stats=False", "seed=0", "batch_size=2",
    "max_steps_per_epoch=3", "epochs=1", "optimizer._component_=torch.optim.AdamW", "optimizer.lr=1e-3",
    "optimizer_in_bwd=False", "metric_logger._component_=torchtune.training.metric_logging.StdoutLogger",
    "model._component_=torchtune.models.llama3_2.llama3_2",
    *(f"model.{key}={value}" for key, value in SHAPE.items()),
    "tokenizer.special_tokens_path=/workspace/model/special_tokens.json", "tokenizer.max_seq_len=256",
    "dataset.source=json", "dataset.data_files=/workspace/dataset/alpaca_tiny.json",
]


if __name__ == "__main__":
    write(Path(sys.argv[1]))
