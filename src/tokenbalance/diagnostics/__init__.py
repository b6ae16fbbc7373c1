"""Diagnostics and logging sinks (JSONL always; TensorBoard / W&B on request)."""
