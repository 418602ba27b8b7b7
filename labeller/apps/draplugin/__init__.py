"""The kubelet DRA plugin (``gpu-labeller dra-plugin``): this node's GPUs as ResourceSlices, and the
claims the kubelet asks it to prepare."""
