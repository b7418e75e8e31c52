// Command pause holds a pod's namespaces for the node tier, as the registry's pause image does: it sleeps
// until SIGTERM or SIGINT and exits 0. Built here because no registry is reached.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
