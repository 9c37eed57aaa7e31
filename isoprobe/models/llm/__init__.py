"""A text LLM (GPT-2 or T5) forecasting LLMTime-serialised series: ``model=llm``. The
LightningModule is :mod:`.module`; LLMTime serialisation (:mod:`.serialization`), the prompts
(:mod:`.prompts`), constrained sampling (:mod:`.grammar`) and loading (:mod:`.loading`) are
beside it."""
