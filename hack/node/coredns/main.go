// CoreDNS with only the plugins a local cluster's DNS add-on uses (the Corefile in e2e/node.py).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// Plugin order as in CoreDNS's plugin.cfg, restricted to the ones compiled in.
	dnsserver.Directives = []string{"errors", "log", "health", "ready", "kubernetes", "cache", "loadbalance", "forward"}
}

func main() {
	coremain.Run()
}
