"""DSpark (DeepSeek-AI + PKU, 2026): the DFlash backbone plus a sequential head and a confidence head
(`drafter.kind: dspark`): its config, model, heads, the fused sequential-head launcher, DeepSpec's
`Qwen3DSparkModel` layout and its family spec. Nothing is imported here, so that reading the family registry
stays torch-free; build, save and load go through pdraft.models like every family."""
