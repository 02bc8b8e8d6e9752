// Command kube is one binary for every Kubernetes component the local test cluster runs, and etcd,
// so the large link step is paid once. It dispatches on the name it was called by (a symlink such
// as kubelet -> kube) or on its first argument (kube kubelet --flags...).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	_ "time/tzdata"
)

var components = map[string]func(args []string) int{
	"kube-apiserver": func([]string) int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func([]string) int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func([]string) int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet": func([]string) int {
		return cli.Run(kubelet.NewKubeletCommand(context.Background()))
	},
	"kube-proxy": func([]string) int { return cli.Run(proxy.NewProxyCommand()) },
	"kubectl": func(args []string) int {
		logs.GlogSetter(kubectl.GetLogVerbosity(args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
		return 0
	},
	"etcd": func(args []string) int { etcdmain.Main(args); return 0 },
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Called as `kube COMPONENT ...`: drop our own name so the component sees its usual argv.
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [flags], or call it through a symlink named after one of %v\n", names)
		os.Exit(2)
	}
	os.Exit(run(os.Args))
}
