"""kvfuzz's harness: op language, generators, differential runner, oracles, case files."""
