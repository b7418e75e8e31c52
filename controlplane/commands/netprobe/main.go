// Command netprobe is the pod that devtools/clusters/netpol.py puts on both ends of a NetworkPolicy check: it
// answers "ok" on TCP port 8080, and with arguments it also connects to each HOST:PORT given, once a
// second, and prints one line per attempt ("<unix seconds> <target> ok" or "... fail <error>"), which the
// check reads from the pod's log. Static and FROM scratch, as the pause image, because no registry is reached.
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	ln, err := net.Listen("tcp", ":8080")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok\n"))
			c.Close()
		}
	}()
	for _, target := range os.Args[1:] {
		go dial(target)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}

func dial(target string) {
	for range time.Tick(time.Second) {
		c, err := net.DialTimeout("tcp", target, 800*time.Millisecond)
		if err == nil {
			buf := make([]byte, 3)
			c.SetReadDeadline(time.Now().Add(800 * time.Millisecond))
			_, err = c.Read(buf)
			c.Close()
		}
		if err != nil {
			fmt.Printf("%d %s fail %v\n", time.Now().Unix(), target, err)
		} else {
			fmt.Printf("%d %s ok\n", time.Now().Unix(), target)
		}
	}
}
