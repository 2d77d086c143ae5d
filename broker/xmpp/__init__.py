"""The XMPP codec (XMPP-PROFILE.md): sans-IO, no Django, no asyncio.

- :mod:`.xml`: one RFC 7395 frame parsed with defusedxml under a size cap; XML written.
- :mod:`.stream`: the stream's state machine (open, SASL, re-open, bind, stanzas, close).
- :mod:`.stanzas`: the XEP-0060 / XEP-0254 subset's IQs as commands; the server's stanzas.
- :mod:`.payload`: item payloads ↔ the broker's message.
"""
