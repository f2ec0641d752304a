// CoreDNS with only the plugins the test cluster's DNS needs (kubernetes records, errors, caching): the
// full plugin set (cloud DNS providers, tracing exporters…) costs minutes of compile time on 2 cores and
// none of it is used here.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
