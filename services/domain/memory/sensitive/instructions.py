"""`instruction`: text aimed at the assistant rather than about the person, or markup that could
break out of the memory fence."""

from __future__ import annotations

import re

from quipu.services.domain.memory.sensitive.words import words

_ASSISTANT = words(
    r"the (?:assistant|ai|bot|chatbot)",
    r"claude",
    r"chatgpt",
    r"el (?:asistente|bot|chatbot)",
    r"la (?:ia|inteligencia artificial)",
)
_BASE_VERBS = words(
    r"answer",
    r"respond",
    r"reply",
    r"say",
    r"tell",
    r"mention",
    r"use",
    r"include",
    r"recommend",
    r"call",
    r"refuse",
    r"reveal",
    r"ask",
    r"write",
    r"speak",
    r"talk",
    r"address",
    r"greet",
    r"add",
    r"end",
    r"start",
    r"begin",
    r"sign",
    r"suggest",
    r"agree",
    r"obey",
    r"follow",
    r"do",
    r"output",
    r"print",
    r"send",
    r"share",
    r"trust",
    r"comply",
    r"lie",
    r"give",
    r"provide",
    r"assume",
    r"treat",
    r"prioriti[sz]e",
    r"ignore",
    r"forget",
    r"link",
    r"redirect",
    r"approve",
    r"grant",
    r"execute",
    r"run",
)
_FENCE_TAGS = words(
    r"system",
    r"assistant",
    r"user",
    r"human",
    r"instructions?",
    r"memory",
    r"memoria",
    r"facts?",
    r"hechos",
    r"prompt",
    r"tool\w*",
    r"context",
    r"session",
    r"sesion",
    r"document\w*",
    r"im_start",
    r"im_end",
    r"user_said",
    r"previous_assistant",
    r"assistant_answered",
    r"profile",
)
_INSTRUCTION = re.compile(
    # overriding the rules
    r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,30}?"
    r"\b(?:instructions?|rules?|prompts?|guidelines?|polic(?:y|ies)|guardrails?|"
    r"everything (?:above|before))\b"
    r"|\b(?:ignora\w*|olvida\w*|omite|descarta)\b.{0,30}?"
    r"\b(?:instrucciones|reglas|indicaciones|normas|prompt|lo anterior|todo lo anterior)\b"
    r"|\b(?:previous|prior|above|earlier|original|system|developer|hidden) (?:instructions?|prompts?|rules)\b"
    r"|\binstrucciones (?:anteriores|previas|originales|del sistema|ocultas)\b"
    r"|\b(?:system prompt|prompt del sistema|jailbreak|developer mode|modo desarrollador|do anything now)\b"
    # addressing the assistant
    r"|\byou (?:must|should|shall|will|have to|need to|are (?:now|required|to|not allowed)|may not|"
    r"cannot|can't|must not|mustn't|are going to)\b"
    rf"|\b{_ASSISTANT}\b.{{0,15}}?\b(?:must|should|shall|will|has to|needs to|always|never|"
    r"is (?:required|not allowed)|debe\w*|tiene que|siempre|nunca|ha de)\b"
    rf"|\b(?:always|never|don't|do not)\s+(?:\w+\s+)?{_BASE_VERBS}\b"
    r"|\b(?:from now on|going forward|henceforth|a partir de ahora|de ahora en adelante|desde ahora)\b"
    r"|\b(?:act|behave|respond|answer) as (?:if|though|an?|the)\b|\bpretend (?:to be|that|you)\b|\broleplay\b"
    r"|\b(?:actua|comportate|responde) como\b|\bfinge (?:ser|que)\b|\bhaz como si\b|\bhaz de cuenta\b"
    r"|\b(?:debes|deberas|deberias|tienes que|tendras que|estas obligad[oa])\b"
    r"|\bno (?:le |me |les )?(?:digas|menciones|reveles|respondas|contestes|uses|hagas|sigas|obedezcas|"
    r"compartas|pidas)\b"
    r"|\b(?:nunca|jamas|siempre) (?:le |me |les )?(?:digas|menciones|reveles|respondas|contestes|"
    r"recomiendes|incluyas|uses|hables|escribas)\b"
    r"|\b(?:respondeme|contestame|dime|dile|recuerdame|llamame|hablame|escribeme|obedeceme)\b"
    # exfiltration: "send the data to http://..."
    r"|\b(?:send|forward|email|upload|post|leak|exfiltrate|envia|reenvia|manda|sube|filtra)\b.{0,60}?"
    r"(?:https?://|www\.|\S+@\S+\.\w+)"
    # markup that could break out of the memory fence
    rf"|</?\s*{_FENCE_TAGS}\b[^>]*>|\[/?(?:inst|system|sys)\]|```|<\|"
    r"|^\W*(?:system|assistant|user|human|sistema|asistente)\s*:"
)
_IMPERATIVE_OPENING = re.compile(
    r"^\W*(?:ignore|disregard|forget|answer|respond|reply|say|tell|pretend|reveal|print|output|send|"
    r"include|recommend|use|write|obey|follow|do|don't|stop|remember to|make sure|be|call|translate|"
    r"add|start|begin|end|act|speak|talk)\b"
)
"""A fact opening with a bare English imperative ("Use tabs", "Reply in French") is a command.

A declarative fact drops its subject but keeps the verb's -s ("Uses tabs", "Replies fast").
Spanish is not checked this way: its familiar imperative is spelled like the third person ("Usa
PostgreSQL" is both), so Spanish commands are recognised by the phrases above instead."""


def is_instruction(folded: str) -> bool:
    if _INSTRUCTION.search(folded):
        return True
    return bool(_IMPERATIVE_OPENING.search(folded))
