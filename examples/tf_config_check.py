"""Print this node's TensorFlow role from TF_CONFIG, as MultiWorkerMirroredStrategy would read it."""

import json
import os

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
print(f"{task['type']} {task['index']} of cluster {json.dumps(config['cluster'], sort_keys=True)}")
