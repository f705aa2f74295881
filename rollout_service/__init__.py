"""Policy serving (:mod:`.policy`, vLLM or transformers engines), the agent loop (:mod:`.agent`),
the one episode runner (:mod:`.episode`), the async rollout orchestrator and its curriculum, the
experience stream producer and the OpenAI-compatible API. The documentation checker
(``doccheck``), the data generators (``datagen``) and the jobs API (``jobsapi``) are packages of
their own above this one."""
