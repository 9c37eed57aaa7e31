"""A text LLM (GPT-2 or T5) forecasting LLMTime-serialised series: ``model=llm``."""

from isoprobe.models.llm.module import LlmModule
from isoprobe.models.llm.serialization import CharVocabulary, Serializer, TokenMap

__all__ = ["CharVocabulary", "LlmModule", "Serializer", "TokenMap"]
