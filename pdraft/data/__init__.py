"""Training and evaluation data: prompt sets from files, datasets ids or the embedded corpus, the chat
template as decode applies it, training sequences with loss masks, and regeneration by the target."""

from pdraft.data.prompts import Conversation, PromptSet, load_prompts, parse_record, read_jsonl
from pdraft.data.templates import TrainingSequence, build_sequence, build_sequences, encode_prompt

__all__ = ["Conversation", "PromptSet", "TrainingSequence", "build_sequence", "build_sequences", "encode_prompt",
           "load_prompts", "parse_record", "read_jsonl"]
