// A device plugin for the real-node test cluster that advertises fake nvidia.com/gpu devices and, like
// NVIDIA's plugin, hands the allocated ones to the container in NVIDIA_VISIBLE_DEVICES.

module hpcbridge.test/kube-build/fakegpu

go 1.26.0

require (
	google.golang.org/grpc v1.79.3
	k8s.io/kubelet v0.36.3
)

require (
	golang.org/x/net v0.49.0 // indirect
	golang.org/x/sys v0.40.0 // indirect
	golang.org/x/text v0.33.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
