// Command kube-network-policies is the NetworkPolicy implementation the node tier runs on each node:
// sigs.k8s.io/kube-network-policies (nftables rules that send a pod's new connections to an nfqueue, and a
// userspace verdict on each), over the packages of its module, as its own cmd/main.go does. It exists
// because upstream's main reads only the in-cluster configuration (a pod of a DaemonSet with a service
// account), while a node of the tier runs it as a process in the node's network namespace, as it runs
// kubelet: --kubeconfig here, and SIGTERM ends it as SIGINT does (upstream's main stops on SIGINT only,
// and so would leave no grace for its own clean-up). The flags keep upstream's names and defaults otherwise,
// but two: AdminNetworkPolicy and BaselineAdminNetworkPolicy (alpha, off by default upstream) are left out,
// and so is --disable-nri, which upstream's main parses and never passes on: the NRI plugin is always made,
// as upstream's main makes it. It must be: v0.8.0 without it dereferences a nil plugin, and dies, on the
// first packet from or to an address that is no pod's (kube-apiserver calling a webhook, a node, anything
// outside), since its pod lookup falls back to the plugin's table unchecked (getPodAssignedToIP). Where the
// runtime has no NRI socket the plugin only logs "nri plugin exited" and its table stays empty; pod IPs
// then come from the API server alone.
//
// Built by scripts/build-kube-network-policies.sh, with one file of github.com/google/nftables replaced
// at build time (_nftables/expr/queue.go: why is said there).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

var (
	kubeconfig          string
	failOpen            bool
	queueID             int
	metricsBindAddress  string
	hostnameOverride    string
	netfilterBug1766Fix bool
)

func init() {
	flag.StringVar(&kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty: the in-cluster configuration (a pod's service account)")
	flag.BoolVar(&failOpen, "fail-open", false, "If set, don't drop packets if the controller is not running")
	flag.IntVar(&queueID, "nfqueue-id", 100, "Number of the nfqueue used")
	flag.StringVar(&metricsBindAddress, "metrics-bind-address", ":9080", "The IP address and port for the metrics server to serve on")
	flag.StringVar(&hostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-network-policies is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	flag.BoolVar(&netfilterBug1766Fix, "netfilter-bug-1766-fix", true, "If set, process DNS packets on the PREROUTING hooks to avoid the race condition on the conntrack subsystem, not needed for kernels 6.12+ (see https://bugzilla.netfilter.org/show_bug.cgi?id=1766)")
	flag.Usage = func() {
		fmt.Fprint(os.Stderr, "Usage: kube-network-policies [options]\n\n")
		flag.PrintDefaults()
	}
}

func main() {
	os.Exit(run())
}

func run() int {
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, flag.CommandLine)
	flag.Parse()
	logs.InitLogs()
	if err := logsapi.ValidateAndApply(c, nil); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		return 1
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, unix.SIGTERM)
	defer cancel()
	logger := klog.FromContext(ctx)
	flag.VisitAll(func(f *flag.Flag) {
		logger.Info("flag", "name", f.Name, "value", f.Value)
	})

	if _, _, err := net.SplitHostPort(metricsBindAddress); err != nil {
		logger.Error(err, "parsing metrics bind address", "address", metricsBindAddress)
		return 1
	}
	nodeName, err := nodeutil.GetHostname(hostnameOverride)
	if err != nil {
		logger.Error(err, "can not obtain the node name, use --hostname-override")
		return 1
	}
	cfg := networkpolicy.Config{
		FailOpen:            failOpen,
		QueueID:             queueID,
		NodeName:            nodeName,
		NetfilterBug1766Fix: netfilterBug1766Fix,
	}

	// An empty path and no master: the in-cluster configuration, as upstream's main.
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		logger.Error(err, "loading the client configuration", "kubeconfig", kubeconfig)
		return 1
	}
	// Protobuf, as upstream's main asks for (the built-in types only; no CRDs here).
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		logger.Error(err, "creating the client")
		return 1
	}
	informersFactory := informers.NewSharedInformerFactory(clientset, 0)

	http.Handle("/metrics", promhttp.Handler())
	go func() {
		utilruntime.HandleError(http.ListenAndServe(metricsBindAddress, nil))
	}()

	controller, err := networkpolicy.NewController(
		clientset,
		informersFactory.Networking().V1().NetworkPolicies(),
		informersFactory.Core().V1().Namespaces(),
		informersFactory.Core().V1().Pods(),
		nil, nil, nil, nil, // nodes, and the (Baseline)AdminNetworkPolicy client and informers: not used here
		cfg,
	)
	if err != nil {
		logger.Error(err, "Can not start network policy controller")
		return 1
	}
	go func() {
		utilruntime.HandleError(controller.Run(ctx))
	}()
	informersFactory.Start(ctx.Done())

	<-ctx.Done()
	// As upstream: a grace period for the controller to remove its nftables table.
	time.Sleep(5 * time.Second)
	return 0
}
