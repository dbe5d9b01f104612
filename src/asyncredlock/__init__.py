"""asyncredlock: asyncio-native Redlock over N Redis/Valkey masters."""
