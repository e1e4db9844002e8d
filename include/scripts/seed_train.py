"""Seed training script in the service's documented shape, adapted only in model and data path.

The model is a tiny Llama built from a LlamaConfig (no download) and the data is the
``*.txt`` files of a directory, tokenized as bytes. The checkpoint lines are the
service's, unchanged: run with ``PYTHONPATH=$CHECKPOINT_VENDOR``.

    python include/scripts/seed_train.py --data_dir include/corpus --output_dir /tmp/run
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from datastates.llm import DecoratedCheckpointing  # via PYTHONPATH=$CHECKPOINT_VENDOR


class ByteBlocks(Dataset):
    """Fixed-length blocks of the corpus bytes; labels are the inputs (causal LM)."""

    def __init__(self, data_dir: str, seq_len: int) -> None:
        files = sorted(Path(data_dir).rglob("*.txt"))
        if not files:
            raise SystemExit(f"no *.txt files under {data_dir}")
        data = torch.tensor(list(b"".join(f.read_bytes() for f in files)), dtype=torch.long)
        count = max(1, (len(data) - 1) // seq_len)
        data = data[: count * seq_len] if len(data) >= seq_len else data.repeat(seq_len // len(data) + 1)[:seq_len]
        self.blocks = data.view(-1, seq_len)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block.clone()}


def build_model(seed: int) -> LlamaForCausalLM:
    """A tiny Llama (~0.1M parameters) from a config; nothing is downloaded."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line of the seed script."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", default=os.environ.get("SAT_DATA_DIR", "include/corpus"))
    parser.add_argument("--output_dir", default=os.environ.get("SAT_OUTPUT_DIR", "output"))
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--deepspeed", default=None)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train with the concurrent checkpoint engine; resume when CKPT_LAST_STEP is set."""
    args = parse_args(argv)
    print("Starting dataset initialization", flush=True)
    train_dataset = ByteBlocks(args.data_dir, args.seq_len)
    model = build_model(args.seed)
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, save_strategy="steps",
        per_device_train_batch_size=args.per_device_train_batch_size, learning_rate=args.learning_rate,
        logging_steps=1, seed=args.seed, report_to="none", deepspeed=args.deepspeed,
        dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset)

    config = {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer}
    ckpt_engine = DecoratedCheckpointing(runtime_config=config, rank=args.local_rank)   # rank -1 when not distributed
    resume_from_checkpoint = os.getenv("CKPT_LAST_STEP") is not None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    trainer.save_model(os.path.join(args.output_dir, "final"))


if __name__ == "__main__":
    main()
