"""Captures of ``ibstat``/``ibstatus`` for the producer's tests, excerpts of leptonai/gpud's, unchanged but cut
to a few CAs: ``pkg/nvidia-query/infiniband/testdata/ibstat.47.0.h100.some.down.0`` @ 4446606e (an H100
node: InfiniBand ports Active at 400, Ethernet ports Down/Disabled at 40, tabs),
``.../ibstat.47.0.h100.some.down.with.polling.1`` @ c547ffed (a RoCE node, one port Down/Polling),
``.../ibstat.39.0.a100.failed.ibpanic.exit-255.0`` @ c9874d34 (an A100 node, indentation as spaces,
ending in an ``ibpanic`` line) and ``.../ibstatus.39.0.a100.all.active.0`` @ c9874d34; and the
one-port layout written from rdma-core ``infiniband-diags/ibstat.c`` @ 691953d8.
"""

from __future__ import annotations


H100_SOME_DOWN = """CA 'mlx5_2'
\tCA type: MT4125
\tNumber of ports: 1
\tFirmware version: 22.38.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300c2b691
\tSystem image GUID: 0x946dae0300c2b690
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tRate: 40
\t\tBase lid: 0
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0x00010000
\t\tPort GUID: 0x966daefffec2b691
\t\tLink layer: Ethernet
CA 'mlx5_3'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300cde728
\tSystem image GUID: 0x946dae0300cde728
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 143
\t\tLMC: 0
\t\tSM lid: 334
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0x946dae0300cde728
\t\tLink layer: InfiniBand
"""

ROCE_POLLING = """CA 'mlx5_10'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0xa088c20300bb98b4
\tSystem image GUID: 0xa088c20300bb98b4
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 0
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0x00010000
\t\tPort GUID: 0xa288c2fffebb98b4
\t\tLink layer: Ethernet
CA 'mlx5_11'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0xa088c20300bb3514
\tSystem image GUID: 0xa088c20300bb3514
\tPort 1:
\t\tState: Down
\t\tPhysical state: Polling
\t\tRate: 40
\t\tBase lid: 0
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0x00010000
\t\tPort GUID: 0x0000000000000000
\t\tLink layer: Ethernet
"""

A100_IBPANIC = """CA 'mlx5_7'
        CA type: MT4124
        Number of ports: 1
        Firmware version: 20.41.1000
        Hardware version: 0
        Node GUID: 0x00155dfffe3411f2
        System image GUID: 0xb83fd203006e277c
        Port 1:
                State: Active
                Physical state: LinkUp
                Rate: 200
                Base lid: 13305
                LMC: 0
                SM lid: 1
                Capability mask: 0xa651ec48
                Port GUID: 0x00155dfffd3411f2
                Link layer: InfiniBand
ibpanic: [1400444] main: stat of IB device 'mlx5_8' failed: No such file or directory
"""

IBSTATUS = """Infiniband device 'mlx5_0' port 1 status:
        default gid:     fe80:0000:0000:0000:0015:5dff:fd34:11eb
        base lid:        0x33bf
        sm lid:          0x1
        state:           4: ACTIVE
        phys state:      5: LinkUp
        rate:            200 Gb/sec (4X HDR)
        link_layer:      InfiniBand

Infiniband device 'mlx5_8' port 1 status:
        default gid:     unknown
        base lid:        0x0
        sm lid:          0x0
        state:           4: ACTIVE
        phys state:      5: LinkUp
        rate:            40 Gb/sec (4X QDR)
        link_layer:      Ethernet

"""


# `ibstat mlx5_3 1`: ca_stat prints "%s: '%s'" then port_dump(..., alone=1), no indentation
# (rdma-core infiniband-diags/ibstat.c @ 691953d8); the values are mlx5_3's of H100_SOME_DOWN.
ONE_PORT = """CA: 'mlx5_3'
Port 1:
State: Active
Physical state: LinkUp
Rate: 400
Base lid: 143
LMC: 0
SM lid: 334
Capability mask: 0xa751e848
Port GUID: 0x946dae0300cde728
Link layer: InfiniBand
"""
