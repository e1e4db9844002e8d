"""Train a tiny Llama on a staged text corpus with the HF Trainer and the concurrent checkpoint engine.

Shaped like the service's documented user script: build the Trainer, wrap it with
`DecoratedCheckpointing`, then `trainer.train(resume_from_checkpoint=...)` where a resume
is asked for when `CKPT_LAST_STEP` is set. Only the model (built from a config, no
download) and the data path (a directory of .txt files) differ. Needs
`PYTHONPATH=$CHECKPOINT_VENDOR` for the `datastates` import, as in the service.
"""

import argparse
import glob
import json
import os

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DataCollatorForLanguageModeling,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Trainer,
    TrainingArguments,
)

from datastates.llm import DecoratedCheckpointing


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data_dir", required=True, help="directory of .txt files (the staged data)")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=160)
    parser.add_argument("--save_steps", type=int, default=20)
    parser.add_argument("--block_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--vocab_size", type=int, default=1024)
    parser.add_argument("--local_rank", type=int, default=int(os.getenv("LOCAL_RANK", "-1")))
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args()


def load_texts(data_dir):
    files = sorted(glob.glob(os.path.join(data_dir, "**", "*.txt"), recursive=True))
    if not files:
        raise SystemExit(f"no .txt files under {data_dir}")
    texts = []
    for path in files:
        with open(path, encoding="utf-8") as handle:
            texts.extend(line.strip() for line in handle if line.strip())
    return files, texts


def build_tokenizer(texts, vocab_size, save_dir):
    """A byte-level BPE tokenizer trained on the corpus itself (deterministic)."""
    path = os.path.join(save_dir, "tokenizer.json")
    if os.path.exists(path):
        tok = Tokenizer.from_file(path)
    else:
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<pad>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        os.makedirs(save_dir, exist_ok=True)
        tok.save(path)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def build_dataset(tokenizer, texts, block_size):
    ids = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
    n_blocks = len(ids) // block_size
    blocks = [ids[i * block_size:(i + 1) * block_size] for i in range(n_blocks)]
    return Dataset.from_dict({"input_ids": blocks})


def main():
    args = parse_args()
    torch.manual_seed(args.seed)
    files, texts = load_texts(args.data_dir)
    print(f"dataset: {len(files)} files, {len(texts)} lines", flush=True)
    tokenizer = build_tokenizer(texts, args.vocab_size, os.path.join(args.output_dir, "tokenizer"))
    train_dataset = build_dataset(tokenizer, texts, args.block_size)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.block_size,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    print(f"model parameters: {sum(p.numel() for p in model.parameters()):,}", flush=True)

    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        logging_steps=10,
        save_strategy="steps",
        save_steps=args.save_steps,
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False),
    )

    # --- the service's documented lines, unchanged ---
    config = {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer}
    ckpt_engine = DecoratedCheckpointing(runtime_config=config, rank=args.local_rank)
    resume_from_checkpoint = os.getenv("CKPT_LAST_STEP") is not None
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    # ---

    final_dir = os.path.join(args.output_dir, "final")
    trainer.save_model(final_dir)
    tokenizer.save_pretrained(final_dir)
    trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(json.dumps({"final_step": trainer.state.global_step, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
