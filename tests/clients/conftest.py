from tests.clients.sglang_site import sglang_site  # noqa: F401 - the fixture, shared by the SGLang tests
