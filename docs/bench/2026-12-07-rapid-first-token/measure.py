"""RAPID (eta 0) time to first token on a prefix-cache hit, embedded SmolLM2 drafting for itself."""
import json, sys, time
from langchain_core.messages import HumanMessage
from specrag.demo import normans_document
from specrag.models.rapid_chat import ChatRapid

doc = normans_document()
model = ChatRapid(eta=0.0, max_new_tokens=24)
model.load()
qs = ["What was the name of the count of Apulia?", "Who was the Norse leader?",
      "When was the Duchy of Normandy founded?", "Who ruled the duchy of Normandy?",
      "What is the original meaning of the word Norman?"]
model.invoke([HumanMessage(qs[0])], document=doc)  # warm: the document's prefix is cached
rows = []
for q in qs[1:] * 2:
    t0 = time.perf_counter(); first = None; text = ""
    for chunk in model.stream([HumanMessage(q)], document=doc):
        if first is None and chunk.content:
            first = time.perf_counter() - t0
        text += chunk.content
    total = time.perf_counter() - t0
    rows.append({"q": q, "ttft_s": round(first, 3), "total_s": round(total, 3), "answer": text[:60]})
    print(rows[-1], file=sys.stderr)
print(json.dumps(rows))
