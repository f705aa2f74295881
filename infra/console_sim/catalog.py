"""Static catalogue of the local cloud: regions, zones, instance types, images, RAM system
policies. Names and shapes follow the real Alibaba Cloud; the selection is small on purpose."""
from __future__ import annotations

# region id -> (two-letter infix that real resource ids carry for that region, zones)
REGIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cn-hangzhou": ("bp", ("cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j", "cn-hangzhou-k")),
    "cn-shanghai": ("uf", ("cn-shanghai-e", "cn-shanghai-f", "cn-shanghai-g")),
    "cn-beijing": ("2z", ("cn-beijing-g", "cn-beijing-h", "cn-beijing-i")),
    "cn-shenzhen": ("wz", ("cn-shenzhen-d", "cn-shenzhen-e", "cn-shenzhen-f")),
    "ap-southeast-1": ("t4", ("ap-southeast-1a", "ap-southeast-1b", "ap-southeast-1c")),
    "us-west-1": ("rj", ("us-west-1a", "us-west-1b")),
}
DEFAULT_REGION = "cn-hangzhou"

# instance type -> (family, vCPU, memory MiB)
INSTANCE_TYPES: dict[str, tuple[str, int, int]] = {
    "ecs.t6-c1m1.large": ("ecs.t6", 2, 2048),
    "ecs.t6-c1m2.large": ("ecs.t6", 2, 4096),
    "ecs.e-c1m1.large": ("ecs.e", 2, 2048),
    "ecs.e-c1m2.large": ("ecs.e", 2, 4096),
    "ecs.g7.large": ("ecs.g7", 2, 8192),
    "ecs.g7.xlarge": ("ecs.g7", 4, 16384),
    "ecs.c7.large": ("ecs.c7", 2, 4096),
    "ecs.c7.xlarge": ("ecs.c7", 4, 8192),
    "ecs.r7.large": ("ecs.r7", 2, 16384),
    "ecs.u1-c1m2.large": ("ecs.u1", 2, 4096),
}

# image id -> (OS name, OS type)
IMAGES: dict[str, tuple[str, str]] = {
    "aliyun_3_x64_20G_alibase_20240819.vhd": ("Alibaba Cloud Linux 3.2104 LTS 64-bit", "linux"),
    "ubuntu_22_04_x64_20G_alibase_20240710.vhd": ("Ubuntu 22.04 64-bit", "linux"),
    "ubuntu_24_04_x64_20G_alibase_20240812.vhd": ("Ubuntu 24.04 64-bit", "linux"),
    "centos_7_9_x64_20G_alibase_20240628.vhd": ("CentOS 7.9 64-bit", "linux"),
    "debian_12_6_x64_20G_alibase_20240711.vhd": ("Debian 12.6 64-bit", "linux"),
    "win2022_21H2_x64_dtc_en-us_40G_alibase_20240716.vhd": (
        "Windows Server 2022 Datacenter 64-bit (English)", "windows"),
}

# RAM system policies that AttachPolicyToUser accepts with PolicyType=System
SYSTEM_POLICIES: dict[str, str] = {
    "AdministratorAccess": "Provides full access to Alibaba Cloud services and resources.",
    "ReadOnlyAccess": "Provides read-only access to Alibaba Cloud services and resources.",
    "AliyunECSFullAccess": "Provides full access to Elastic Compute Service (ECS) via Management Console.",
    "AliyunECSReadOnlyAccess": "Provides read-only access to Elastic Compute Service (ECS).",
    "AliyunVPCFullAccess": "Provides full access to Virtual Private Cloud (VPC) via Management Console.",
    "AliyunVPCReadOnlyAccess": "Provides read-only access to Virtual Private Cloud (VPC).",
    "AliyunOSSFullAccess": "Provides full access to Object Storage Service (OSS) via Management Console.",
    "AliyunOSSReadOnlyAccess": "Provides read-only access to Object Storage Service (OSS).",
    "AliyunRAMFullAccess": "Provides full access to Resource Access Management (RAM).",
    "AliyunRAMReadOnlyAccess": "Provides read-only access to Resource Access Management (RAM).",
    "AliyunActionTrailFullAccess": "Provides full access to ActionTrail.",
    "AliyunActionTrailReadOnlyAccess": "Provides read-only access to ActionTrail.",
}

# ActionTrail resource types
RT_INSTANCE = "ACS::ECS::Instance"
RT_SECURITY_GROUP = "ACS::ECS::SecurityGroup"
RT_VPC = "ACS::VPC::VPC"
RT_VSWITCH = "ACS::VPC::VSwitch"
RT_RAM_USER = "ACS::RAM::User"
RT_RAM_POLICY = "ACS::RAM::Policy"
RT_BUCKET = "ACS::OSS::Bucket"
