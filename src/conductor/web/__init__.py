"""A lean asyncio HTTP/1.1 server (httptools) for the gateway and the emulated engines."""
