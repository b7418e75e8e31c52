// Copyright 2018 Google LLC. All Rights Reserved.
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

// This file replaces expr/queue.go of github.com/google/nftables v0.3.0 when
// scripts/build-kube-network-policies.sh builds kube-network-policies (copied over that file in a vendored
// copy of the module; the directory's leading underscore keeps the go command from seeing it here). One
// change: Queue is sent to the kernel as the xtables NFQUEUE target through nft_compat instead of
// nftables' own queue expression.
//
// Why: kube-network-policies sends packets to its nfqueue with expr.Queue (three places in v0.8.0), which
// needs the kernel's nft_queue (CONFIG_NFT_QUEUE). Kernels built without it refuse every rule that holds
// one (ENOENT: no such expression type), so the whole table fails to load. xt_NFQUEUE through nft_compat
// (CONFIG_NFT_COMPAT, CONFIG_NETFILTER_XT_TARGET_NFQUEUE) does the same, in inet, ip and ip6 tables: the
// packet goes to the same netlink queue (nfnetlink_queue), held until userspace's verdict, or accepted
// when no one listens and the bypass flag is set. iptables-nft emits the same target for `-j NFQUEUE`.
// Revision 3 takes the same three values as the native expression: queue number, number of queues and
// flags, whose bits (bypass 1, cpu fanout 2) are the same in both.
//
// unmarshal is upstream's: what the kernel sends back for this rule is a "target" expression (expr.Target),
// which kube-network-policies never reads.

package expr

import (
	"encoding/binary"

	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

type QueueAttribute uint16

type QueueFlag uint16

// Possible QueueAttribute values
const (
	QueueNum   QueueAttribute = unix.NFTA_QUEUE_NUM
	QueueTotal QueueAttribute = unix.NFTA_QUEUE_TOTAL
	QueueFlags QueueAttribute = unix.NFTA_QUEUE_FLAGS

	QueueFlagBypass QueueFlag = unix.NFT_QUEUE_FLAG_BYPASS
	QueueFlagFanout QueueFlag = unix.NFT_QUEUE_FLAG_CPU_FANOUT
	QueueFlagMask   QueueFlag = unix.NFT_QUEUE_FLAG_MASK
)

type Queue struct {
	Num   uint16
	Total uint16
	Flag  QueueFlag
}

func (e *Queue) marshal(fam byte) ([]byte, error) {
	return e.target().marshal(fam)
}

func (e *Queue) marshalData(fam byte) ([]byte, error) {
	return e.target().marshalData(fam)
}

// target is e as xt_NFQUEUE's revision 3: struct xt_NFQ_info_v3 { __u16 queuenum; __u16 queues_total;
// __u16 flags; }, in host byte order, padded to XT_ALIGN (8).
func (e *Queue) target() *Target {
	if e.Total == 0 {
		e.Total = 1 // The total default value is 1
	}
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:], e.Num)
	binary.NativeEndian.PutUint16(info[2:], e.Total)
	binary.NativeEndian.PutUint16(info[4:], uint16(e.Flag&QueueFlagMask))
	return &Target{Name: "NFQUEUE", Rev: 3, Info: &info}
}

func (e *Queue) unmarshal(fam byte, data []byte) error {
	ad, err := netlink.NewAttributeDecoder(data)
	if err != nil {
		return err
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_QUEUE_NUM:
			e.Num = ad.Uint16()
		case unix.NFTA_QUEUE_TOTAL:
			e.Total = ad.Uint16()
		case unix.NFTA_QUEUE_FLAGS:
			e.Flag = QueueFlag(ad.Uint16())
		}
	}
	return ad.Err()
}
