"""asyncio shell: OpenAI API, tokenization, upstream proxy, KV event ingestion."""
