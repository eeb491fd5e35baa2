"""Wire formats of engines and peers; nothing outside this package parses them."""
