"""python minimal.py http://127.0.0.1:8010 MODEL   (the `openai` package; /feedback and /commit with httpx)"""

import sys

import httpx
from openai import OpenAI

base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base + "/v1", api_key="unused")
reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=32)
print(reply.choices[0].message.content)
print(httpx.post(base + "/feedback", json={"msg_ids": [reply.id], "reward": 1.0}).raise_for_status().json())
print(httpx.post(base + "/commit", json={}).raise_for_status().json())
