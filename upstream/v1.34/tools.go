//go:build tools

// Package upstream is never built: its imports keep `go mod tidy` from
// dropping the requirements (and go.sum lines) of the upstream programs that
// evlet builds from this module with `go build` / `go test -c`.
package upstream

import (
	// The loopback control plane (cargo xtask cluster).
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"

	// The reference kubelet, the e2e suite and its helpers.
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/sample-device-plugin"
)
