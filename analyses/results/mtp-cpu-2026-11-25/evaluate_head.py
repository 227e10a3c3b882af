"""Measure the saved MTP head on every held-out training trajectory (every 5th prompt of train.h5), as train-draft
measures a finished head, and print it as JSON. The run's head was saved on interruption by code that wrote the
untrained head's numbers into config.json (fixed in the same session): these are the saved weights' own."""
import json

from specsim.record import train as training
from specsim.record.head_checkpoints import load_heads
from specsim.record.models import load_model

target = load_model("smollm2-135m")
head = load_heads("mtp:head", target)
record = json.load(open("head/config.json"))["training"]
config = training.TrainConfig(**record["config"])
_, held = training.split(training.load_sequences("train.h5", target, head.config.hidden_layers), config.holdout_every)
result = training.evaluate("mtp", head.module.eval(), target, held, config)
print(json.dumps({"steps": record["steps"], "heldout_trajectories": len(held), **result}, indent=1))
