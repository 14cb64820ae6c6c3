"""The fact extractor's domain logic: what the model is asked, and what code lets through.

`proposals`: the schemas, prompts and decoding of the model's answer; `turn`: the extraction
request of one recorded turn; `validation`: what code lets through; `profile`: the profile.

Nothing here does I/O: the adapters load rows and facts, call the model and apply the result.
"""
