"""The BYOC example's training script: a tiny Llama, the HF Trainer, SAT's checkpoint engine, the team's `userlib`.

It runs in the team's own image (Containerfile: SAT's training image plus `userlib`), not in
SAT's: `userlib` gives the data (`ByteBlocks`) and a callback whose lines in the job's log say
which `userlib` ran. The checkpoint lines are the service's documented ones, unchanged:
`DecoratedCheckpointing(runtime_config=..., rank=...)`, then
`trainer.train(resume_from_checkpoint=...)` with a resume asked for when SAT sets
`CKPT_LAST_STEP` (the image puts the engine on PYTHONPATH, `$CHECKPOINT_VENDOR`).

    python train_byoc.py --data_dir DIR --output_dir DIR --max_steps 20 --save_steps 10
"""

from __future__ import annotations

import argparse
import json
import os

# `datastates` is SAT's checkpoint engine (PYTHONPATH=$CHECKPOINT_VENDOR, which the image sets); `userlib` is the
# team's own dependency, installed into its image (Containerfile)
import torch
from datastates.llm import DecoratedCheckpointing
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
from userlib import ByteBlocks, MarkerCallback


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", required=True, help="directory of .txt files (the staged data)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--local_rank", type=int, default=int(os.getenv("LOCAL_RANK", "-1")))
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    print("Starting dataset initialization", flush=True)
    train_dataset = ByteBlocks(args.data_dir, block_size=args.block_size)
    print(f"dataset: {len(train_dataset.files)} files, {len(train_dataset)} blocks", flush=True)

    config = LlamaConfig(  # the demo's tiny Llama (include/scripts/train_tiny_llama.py), on bytes
        vocab_size=ByteBlocks.vocab_size,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.block_size,
    )
    model = LlamaForCausalLM(config)
    print(f"model parameters: {sum(p.numel() for p in model.parameters()):,}", flush=True)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=5,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset, callbacks=[MarkerCallback()])

    # --- the service's documented lines, unchanged ---
    config = {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer}
    ckpt_engine = DecoratedCheckpointing(runtime_config=config, rank=args.local_rank)  # noqa: F841
    resume_from_checkpoint = os.getenv("CKPT_LAST_STEP") is not None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    # ---

    trainer.save_model(os.path.join(args.output_dir, "final"))
    trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(json.dumps({"final_step": trainer.state.global_step, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
