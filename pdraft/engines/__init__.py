"""The engines pdraft drives as child processes, one module each: vLLM (pdraft.engines.vllm_driver, with the worker
script its interpreter runs, vllm_worker.py) and llama.cpp (pdraft.engines.llamacpp: the pinned build and its
llama-server), and the bounded, typed conversation with a child (pdraft.engines.channel). They sit below both
callers: regeneration (pdraft.data: `data.regenerate_engine`) and serving (pdraft.serving: bench, check-serving,
the cost table), so neither reaches into the other. Adding an engine is one module here and, to serve drafters,
one in pdraft.serving."""
