"""OSS console pages: buckets (list, create with name rules, storage class and ACL, detail,
change ACL, delete)."""
from __future__ import annotations

from typing import Any

from starlette.responses import Response

from .core import REGION_NAMES, ConsoleApp, Page, ProductNav
from .ui import Button, Column, Field, FormSpec, Option, Section, Step

NAV = ProductNav("oss", "Object Storage Service", "OSS", (
    ("Buckets", "/console/oss/buckets", "Storage"),
), regional=False)
BUCKETS = "/console/oss/buckets"
ACL_OPTIONS = (
    Option("private", "Private", hint="Only the owner and authorized users can read and write."),
    Option("public-read", "Public Read", hint="Anyone can read objects; only the owner writes."),
    Option("public-read-write", "Public Read/Write",
           hint="Anyone can read and write objects. Use with care."),
)
ACL_LABELS = {o.value: o.label for o in ACL_OPTIONS}


def _bucket_row(b: dict[str, Any]) -> dict[str, Any]:
    return {**b, "RegionName": REGION_NAMES.get(b["Region"], b["Region"]),
            "AclName": ACL_LABELS.get(b["Acl"], b["Acl"]), "_href": f"{BUCKETS}/{b['Name']}"}


def _delete_button(name: str) -> Button:
    return Button("Delete", post=f"{BUCKETS}/{name}/delete", danger=True, confirm_id=name,
                  confirm=f"Delete bucket {name}? The name becomes available to others.")


def register(console: ConsoleApp) -> None:
    console.navs.append(NAV)

    @console.route("/oss/buckets", name="oss_buckets")
    def buckets(page: Page) -> Response:
        rows = [_bucket_row(b) for b in page.read("Oss", "ListBuckets",
                                                  **{"max-keys": 1000})["Buckets"]]
        return console.list_page(
            page, product=NAV, active=BUCKETS, title="Buckets", rows=rows,
            columns=[Column("Name", "Bucket Name", "link"), Column("RegionName", "Region"),
                     Column("StorageClass", "Storage Class"), Column("AclName", "ACL"),
                     Column("CreationDate", "Created")],
            actions=lambda r: [Button("Manage", href=r["_href"]),
                               Button("Change ACL", href=f"{r['_href']}/acl"),
                               _delete_button(r["Name"])],
            toolbar=[Button("Create Bucket", href=f"{BUCKETS}/create", primary=True)],
            search=(("Name", "Bucket name"),))

    @console.route("/oss/buckets/create", methods=("GET", "POST"), name="oss_bucket_create")
    def create_bucket(page: Page) -> Response:
        spec = FormSpec("Create Bucket", [Step("Bucket", (
            Field("BucketName", "Bucket Name", required=True, placeholder="my-bucket-name",
                  help="3 to 63 characters: lowercase letters, digits and hyphens (-); starts "
                       "and ends with a letter or digit. Unique among all users of OSS."),
            Field("Region", "Region", "readonly", api=False, default="China (Hangzhou)",
                  help="Buckets of this local cloud are created in China (Hangzhou)."),
            Field("StorageClass", "Storage Class", "radio", default="Standard", options=(
                Option("Standard", "Standard", hint="Frequently accessed data."),
                Option("IA", "IA", hint="Infrequent access, stored at least 30 days."),
                Option("Archive", "Archive", hint="Archived data, restored before reading."),
                Option("ColdArchive", "Cold Archive", hint="Long-term cold data."))),
            Field("Acl", "ACL", "radio", default="private", options=ACL_OPTIONS),
        ))], submit="OK", cancel=BUCKETS)
        return console.form(
            page, spec, product=NAV, active=BUCKETS, product_name="Oss", action="PutBucket",
            done=lambda _r, v: (f"{BUCKETS}/{v['BucketName']}",
                                f"Bucket {v['BucketName']} created."))

    @console.route("/oss/buckets/{bucket}", name="oss_bucket")
    def bucket(page: Page, bucket: str) -> Response:
        b = _bucket_row(page.read("Oss", "GetBucketInfo", BucketName=bucket[:64])["Bucket"])
        name = b["Name"]
        sections = [Section("Basic Information", fields=[
            ("Bucket Name", name), ("Region", b["RegionName"]),
            ("Endpoint", f"{b['Location']}.aliyuncs.com"), ("Storage Class", b["StorageClass"]),
            ("ACL", b["AclName"]), ("Created", b["CreationDate"])],
            actions=[Button("Change ACL", href=f"{BUCKETS}/{name}/acl")])]
        return page.render("detail.html", product=NAV, active=BUCKETS, title=name, status="",
                           list_href=BUCKETS, list_label="Buckets", sections=sections, tab="",
                           live=False, page_actions=[
                               Button("Change ACL", href=f"{BUCKETS}/{name}/acl"),
                               _delete_button(name)])

    @console.route("/oss/buckets/{bucket}/acl", methods=("GET", "POST"), name="oss_bucket_acl")
    def bucket_acl(page: Page, bucket: str) -> Response:
        b = page.read("Oss", "GetBucketInfo", BucketName=bucket[:64])["Bucket"]
        name = b["Name"]
        spec = FormSpec(f"ACL of {name}", [Step("Access Control", (
            Field("Acl", "Bucket ACL", "radio", required=True, options=ACL_OPTIONS),))],
            submit="Save", cancel=f"{BUCKETS}/{name}")
        return console.form(
            page, spec, product=NAV, active=BUCKETS, product_name="Oss", action="PutBucketAcl",
            fixed={"BucketName": name}, initial={"Acl": b["Acl"]},
            done=lambda _r, v: (f"{BUCKETS}/{name}",
                                f"ACL of {name} set to {ACL_LABELS.get(v['Acl'], v['Acl'])}."))

    @console.route("/oss/buckets/{bucket}/delete", methods=("POST",), name="oss_bucket_delete")
    def delete_bucket(page: Page, bucket: str) -> Response:
        name = bucket[:64]
        return console.act(page, "Oss", "DeleteBucket", {"BucketName": name}, back=BUCKETS,
                           ok=f"Bucket {name} deleted.", confirm_id=name)
