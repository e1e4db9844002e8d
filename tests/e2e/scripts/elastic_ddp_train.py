"""A tiny Llama trained with DDP (gloo on CPU) by the HF Trainer and the checkpoint engine, recording what each step saw.

Shaped like the service's documented script (build the Trainer, `DecoratedCheckpointing`, then
`trainer.train(resume_from_checkpoint=...)` when `CKPT_LAST_STEP` is set). For the elastic failover
test (tests/e2e/test_elastic_failover.py): the data is synthetic (each sample an arithmetic sequence
mod the vocabulary, so there is something to learn, and its id travels with it), every step's loss
is logged, and each rank appends one line per micro-batch, `{"step", "rank", "world", "idx"}`, to
`<output_dir>/samples/attempt-<SAT_ATTEMPT>-rank-<rank>.jsonl`. Run it under `torchrun`; with
`--zero_stage N` it trains under DeepSpeed ZeRO-N on CPU (ranks started through `ckpt_engine.launch`).
"""

import argparse
import json
import os
import random
import time

import torch
from datasets import Dataset
from datastates.llm import DecoratedCheckpointing
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

VOCAB, LENGTH = 64, 32


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--save_steps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=8, help="per device")
    parser.add_argument("--learning_rate", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--zero_stage", type=int, default=0,
                        help="DeepSpeed ZeRO stage (1-3; 0: plain DDP); start the ranks through ckpt_engine.launch")
    parser.add_argument("--local_rank", type=int, default=-1, help="passed by ckpt_engine.launch under DeepSpeed")
    parser.add_argument("--step_sleep", type=float, default=0.0,
                        help="seconds each micro-batch waits (so a fault at step N strikes near N)")
    return parser.parse_args()


def build_dataset(count):
    """The same samples whatever the training seed: sequence i starts at a_i and steps by b_i (mod VOCAB)."""
    rng = random.Random(1234)
    rows = {"input_ids": [], "labels": [], "idx": []}
    for i in range(count):
        start, stride = rng.randrange(VOCAB), rng.randrange(1, 8)
        seq = [(start + k * stride) % VOCAB for k in range(LENGTH)]
        rows["input_ids"].append(seq)
        rows["labels"].append(seq)
        rows["idx"].append(i)
    return Dataset.from_dict(rows)


class RecordingTrainer(Trainer):
    """Appends the ids of every micro-batch, with the optimizer step it belongs to, to this rank's file."""

    def compute_loss(self, model, inputs, *args, **kwargs):
        ids = inputs.pop("idx")
        directory = os.path.join(self.args.output_dir, "samples")
        os.makedirs(directory, exist_ok=True)
        name = f"attempt-{os.environ.get('SAT_ATTEMPT', 'none')}-rank-{self.args.process_index}.jsonl"
        with open(os.path.join(directory, name), "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"step": self.state.global_step + 1, "rank": self.args.process_index,
                                     "world": self.args.world_size, "idx": ids.tolist()}) + "\n")
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        return super().compute_loss(model, inputs, *args, **kwargs)


STEP_SLEEP = 0.0


def deepspeed_on_cpu():
    """DeepSpeed's ranks on CPU (as tests/ckpt_engine/run_seed.py): no shared-memory op to build, gloo for Accelerate.

    Accelerate picks no backend without an accelerator and would report world size 1 while
    DeepSpeed runs gloo over every rank.
    """
    import accelerate.state
    import deepspeed.ops
    from accelerate.utils import DistributedType

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    prepare = accelerate.state.PartialState._prepare_backend

    def prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        chosen, kind = prepare(self, cpu, sagemaker_dp, backend)
        if chosen is None and kind == DistributedType.NO and int(os.environ.get("LOCAL_RANK", "-1")) != -1:
            return "gloo", DistributedType.MULTI_CPU
        return chosen, kind

    accelerate.state.PartialState._prepare_backend = prepare_backend


def main():
    global STEP_SLEEP
    args = parse_args()
    STEP_SLEEP = args.step_sleep
    deepspeed = None
    if args.zero_stage:
        deepspeed_on_cpu()
        deepspeed = {"zero_optimization": {"stage": args.zero_stage}, "train_micro_batch_size_per_gpu": "auto",
                     "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
                     "zero_allow_untested_optimizer": True}
    torch.manual_seed(args.seed)
    print("Starting dataset initialization", flush=True)
    train_dataset = build_dataset(args.samples)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=LENGTH)
    model = LlamaForCausalLM(config)
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=1,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=2,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        use_cpu=True,
        disable_tqdm=True,
        deepspeed=deepspeed,
    )
    trainer = RecordingTrainer(model=model, args=training_args, train_dataset=train_dataset,
                               data_collator=default_data_collator)

    # --- the service's documented lines, unchanged ---
    config = {"host_cache_size": 1, "parser_threads": 1, "pin_host_cache": False, "trainer": trainer}
    ckpt_engine = DecoratedCheckpointing(runtime_config=config, rank=int(os.getenv("LOCAL_RANK", "-1")))  # noqa: F841
    resume_from_checkpoint = os.getenv("CKPT_LAST_STEP") is not None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    # ---

    if trainer.args.process_index == 0:
        trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
        losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
        print(json.dumps({"final_step": trainer.state.global_step, "world": trainer.args.world_size,
                          "accumulation": trainer.args.gradient_accumulation_steps, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
