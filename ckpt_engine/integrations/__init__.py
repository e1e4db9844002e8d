"""Where the engine meets training frameworks: the HF Trainer (`hf`), DeepSpeed (`deepspeed`), and the DataStates surface (`datastates`)."""
