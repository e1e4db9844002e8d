"""An example training script, as a team keeps it in its repository: a tiny causal LM, the HF Trainer, SAT's engine.

The checkpoint lines are the service's documented ones (`DecoratedCheckpointing`, then
`trainer.train(resume_from_checkpoint=...)`); SAT puts the engine on PYTHONPATH
(`$CHECKPOINT_VENDOR`). Steps and the checkpoint interval come from the command line, which
the job spec fills from SAT_MAX_STEPS / SAT_SAVE_STEPS when SAT's tests set them.

    python train.py --data_dir DIR --output_dir DIR --max_steps 2000 --save_steps 200
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from datastates.llm import DecoratedCheckpointing  # via PYTHONPATH=$CHECKPOINT_VENDOR
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class ByteBlocks(Dataset):
    """Fixed-length blocks of the bytes of every *.txt file under a folder; labels are the inputs."""

    def __init__(self, data_dir: str, seq_len: int) -> None:
        files = sorted(Path(data_dir).rglob("*.txt"))
        if not files:
            raise SystemExit(f"no *.txt files under {data_dir}")
        data = torch.tensor(list(b"".join(f.read_bytes() for f in files)), dtype=torch.long)
        if len(data) < seq_len:
            data = data.repeat(seq_len // len(data) + 1)
        self.blocks = data[: (len(data) // seq_len) * seq_len].view(-1, seq_len)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        block = self.blocks[index]
        return {"input_ids": block, "labels": block.clone()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=2000)
    parser.add_argument("--save_steps", type=int, default=200)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", "-1")))
    args = parser.parse_args()

    print("Starting dataset initialization", flush=True)
    dataset = ByteBlocks(args.data_dir, seq_len=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False))
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, save_strategy="steps",
        per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=5, seed=0, report_to="none",
        dataloader_num_workers=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)

    config = {"host_cache_size": 1, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer}
    DecoratedCheckpointing(runtime_config=config, rank=args.local_rank)
    trainer.train(resume_from_checkpoint=os.getenv("CKPT_LAST_STEP") is not None)
    trainer.save_model(os.path.join(args.output_dir, "final"))


if __name__ == "__main__":
    main()
