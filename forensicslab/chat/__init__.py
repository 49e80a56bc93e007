"Chat models: OpenAI-compatible, Gemini and local transformers backends, reply cache, reliability, prompts, test servers."
