"""TiRex (NX-AI 2025): isoprobe's own implementation of the xLSTM forecaster (sLSTM blocks)."""
