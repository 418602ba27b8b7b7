"""The bundled kubelet device plugin (API v1beta1 over gRPC)."""
