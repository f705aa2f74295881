"""OSS buckets over OSS's real REST protocol (what the official ``oss2`` SDK speaks), path-style:
``GET /`` ListBuckets, ``PUT /bucket/`` PutBucket, ``PUT|GET /bucket/?acl``, ``GET
/bucket/?bucketInfo``, ``DELETE /bucket/`` (BucketNotEmpty while it holds objects). Signature V1
(``Authorization: OSS AK:sig``, HMAC-SHA1 over verb, Content-MD5, Content-Type, Date, x-oss-*
headers and the resource). Every bucket call goes through the shared service layer, so it is
audited like any API call.

Objects, enough for a blob store (``jobsapi.blobs.OssBlobs``): ``PUT|GET|HEAD|DELETE
/bucket/key`` (PutObject, GetObject, HeadObject, DeleteObject), ``GET /bucket/`` ListObjects
(prefix, marker, max-keys, delimiter, encoding-type=url) and ``POST /bucket/?delete``
DeleteMultipleObjects, at most :data:`OBJECT_MAX_BYTES` an object. They are data events, which
ActionTrail does not record by default, so they are not audited; they are refused like any
call (signature, clock, the bucket's owner)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
from email.utils import formatdate, parsedate_to_datetime
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, unquote_to_bytes
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from starlette.requests import Request
from starlette.responses import Response

from .. import timeutil
from .. import ids
from consolerl.accounts import Account
from consolerl.text import same_secret
from ..catalog import RT_BUCKET
from ..config import SimConfig
from ..errors import CloudError
from ..params import Params
from ..service import CallContext, Caller, CloudService, Product
from ..timeutil import iso

PRODUCT = Product("Oss", "2019-05-17", "oss-cn-hangzhou.aliyuncs.com", "oss.console.aliyun.com")
BUCKET = "oss_bucket"
ACLS = ("private", "public-read", "public-read-write")
STORAGE_CLASSES = ("Standard", "IA", "Archive", "ColdArchive")
_SUBRESOURCES = frozenset({"acl", "bucketInfo", "location", "stat", "tagging", "cors", "lifecycle",
                           "logging", "website", "referer", "policy", "versioning", "encryption",
                           "uploads", "delete", "resourceGroup"})
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
OBJECT_MAX_BYTES = 16 * 2 ** 20     # the emulator's limit for one PutObject (OSS: 5 GB)
OBJECT_KEY_MAX_BYTES = 1023
DELETE_MAX_KEYS = 1000              # DeleteMultipleObjects, as OSS


def _region(ctx: CallContext) -> str:
    return "cn-hangzhou"


def _bucket_name(p: Params) -> str:
    name = p.req("BucketName", max_len=1024)
    if not _BUCKET_RE.fullmatch(name):
        raise CloudError("InvalidBucketName",
                         "The specified bucket is not valid: a bucket name is 3 to 63 characters "
                         "of lowercase letters, digits and hyphens, and starts and ends with a "
                         "letter or digit.", 400)
    return name


def get_bucket(ctx: CallContext, name: str) -> dict[str, Any]:
    ctx.ref(RT_BUCKET, name)
    bucket = ctx.store.get(ctx.account_id, BUCKET, name)
    if bucket is None:
        if ctx.store.owner_of_name(BUCKET, name) is not None:
            raise CloudError("AccessDenied", "You have no right to access this bucket.", 403)
        raise CloudError("NoSuchBucket", "The specified bucket does not exist.", 404)
    return bucket


def _save(ctx: CallContext, bucket: dict[str, Any]) -> None:
    ctx.store.put(ctx.account_id, BUCKET, bucket["Name"], bucket["Region"], bucket,
                  name=bucket["Name"], created_ms=bucket["_created_ms"])


@PRODUCT.action("PutBucket", resource_type=RT_BUCKET)
def put_bucket(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _bucket_name(p)
    ctx.ref(RT_BUCKET, name)
    ctx.region = _region(ctx)
    acl = p.str("Acl", default="private", max_len=32) or "private"
    if acl not in ACLS:
        raise CloudError("InvalidArgument", f"no such bucket access control exists: {acl[:32]}; "
                         f"allowed: {', '.join(ACLS)}.", 400)
    storage = p.str("StorageClass", default="Standard", max_len=32) or "Standard"
    if storage not in STORAGE_CLASSES:
        raise CloudError("InvalidArgument", f"Invalid storage class {storage[:32]}; allowed: "
                         f"{', '.join(STORAGE_CLASSES)}.", 400)
    if ctx.store.owner_of_name(BUCKET, name) is not None:
        raise CloudError("BucketAlreadyExists", "The requested bucket name is not available. "
                         "The bucket namespace is shared by all users of the system. Please "
                         "select a different name and try again.", 409)
    if ctx.store.count(ctx.account_id, BUCKET) >= 100:
        raise CloudError("TooManyBuckets", "You have attempted to create more buckets than "
                         "allowed (100).", 400)
    bucket = {"Name": name, "Acl": acl, "StorageClass": storage, "Region": ctx.region,
              "Location": f"oss-{ctx.region}", "CreationDate": iso(ctx.now_ms).replace("Z", ".000Z"),
              "_created_ms": ctx.now_ms}
    _save(ctx, bucket)
    return {}


@PRODUCT.action("PutBucketAcl", resource_type=RT_BUCKET)
def put_bucket_acl(ctx: CallContext, p: Params) -> dict[str, Any]:
    name = _bucket_name(p)
    acl = p.req("Acl", max_len=32)
    if acl not in ACLS:
        raise CloudError("InvalidArgument", f"no such bucket access control exists: {acl[:32]}; "
                         f"allowed: {', '.join(ACLS)}.", 400)
    bucket = get_bucket(ctx, name)
    ctx.region = bucket["Region"]
    bucket["Acl"] = acl
    _save(ctx, bucket)
    return {}


@PRODUCT.action("GetBucketAcl", rw="Read", resource_type=RT_BUCKET)
def get_bucket_acl(ctx: CallContext, p: Params) -> dict[str, Any]:
    bucket = get_bucket(ctx, _bucket_name(p))
    ctx.region = bucket["Region"]
    return {"Acl": bucket["Acl"]}


@PRODUCT.action("GetBucketInfo", rw="Read", resource_type=RT_BUCKET)
def get_bucket_info(ctx: CallContext, p: Params) -> dict[str, Any]:
    bucket = get_bucket(ctx, _bucket_name(p))
    ctx.region = bucket["Region"]
    return {"Bucket": {k: v for k, v in bucket.items() if not k.startswith("_")}}


@PRODUCT.action("DeleteBucket", resource_type=RT_BUCKET)
def delete_bucket(ctx: CallContext, p: Params) -> dict[str, Any]:
    bucket = get_bucket(ctx, _bucket_name(p))
    ctx.region = bucket["Region"]
    if ctx.store.count_objects(bucket["Name"]):
        raise CloudError("BucketNotEmpty", "The bucket you tried to delete is not empty.", 409)
    ctx.store.delete(ctx.account_id, BUCKET, bucket["Name"])
    return {}


@PRODUCT.action("ListBuckets", rw="Read", resource_type=RT_BUCKET)
def list_buckets(ctx: CallContext, p: Params) -> dict[str, Any]:
    ctx.region = _region(ctx)
    prefix = p.str("prefix", default="", max_len=1024) or ""
    marker = p.str("marker", default="", max_len=1024) or ""
    max_keys = p.int("max-keys", default=100, lo=1, hi=1000)
    assert max_keys is not None
    buckets = sorted((b for b in ctx.store.list(ctx.account_id, BUCKET)
                      if b["Name"].startswith(prefix) and b["Name"] > marker),
                     key=lambda b: b["Name"])
    shown = buckets[:max_keys]
    truncated = len(buckets) > max_keys
    return {"Buckets": [{k: v for k, v in b.items() if not k.startswith("_")} for b in shown],
            "Prefix": prefix, "Marker": marker, "MaxKeys": max_keys, "IsTruncated": truncated,
            "NextMarker": shown[-1]["Name"] if truncated else ""}


# ---- the REST protocol ------------------------------------------------------------------------

def _xml(tag: str, value: Any) -> str:
    if isinstance(value, dict):
        inner = "".join(_xml(k, v) for k, v in value.items())
    elif isinstance(value, bool):
        inner = "true" if value else "false"
    else:
        inner = escape(str(value))
    return f"<{tag}>{inner}</{tag}>"


def _doc(tag: str, value: Any) -> str:
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + _xml(tag, value)


def string_to_sign(method: str, headers: dict[str, str], resource: str) -> str:
    oss_headers = "".join(f"{k}:{headers[k]}\n" for k in sorted(headers) if k.startswith("x-oss-"))
    date = headers.get("x-oss-date") or headers.get("date", "")
    return "\n".join([method, headers.get("content-md5", ""), headers.get("content-type", ""),
                      date, oss_headers + resource])


def sign(secret: str, text: str) -> str:
    return base64.b64encode(hmac.new(secret.encode(), text.encode(), hashlib.sha1).digest()).decode()


def parse_query(raw: bytes) -> dict[str, str]:
    """The query string's parameters (a name without ``=`` has the value ""), each name and
    value percent-decoded as strict UTF-8: an invalid sequence (``prefix=%ff``, a lone
    ``%c3``, an encoded surrogate) is an ``InvalidArgument`` naming the parameter, as the
    OpenAPI refuses it, never a U+FFFD that a lookup would then match."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise CloudError("InvalidArgument", "The query string is not valid UTF-8.", 400) from None
    params: dict[str, str] = {}
    for piece in text.split("&"):
        if not piece:
            continue
        raw_name, _, raw_value = piece.partition("=")
        try:
            name = unquote_plus(raw_name, errors="strict")
        except UnicodeDecodeError:
            raise _not_utf8(raw_name) from None
        try:
            params[name] = unquote_plus(raw_value, errors="strict")
        except UnicodeDecodeError:
            raise _not_utf8(name) from None
    return params


def _not_utf8(name: str) -> CloudError:
    return CloudError("InvalidArgument", f'The query parameter "{name[:64]}" is not valid '
                      "UTF-8 once percent-decoded.", 400)


def check_path(raw_path: bytes | None) -> None:
    """The request path (``/bucket/object-key``) must percent-decode to valid UTF-8: the
    server's own decoding would put U+FFFD in the bucket name or the object's key instead."""
    if raw_path is None:
        return
    bucket, _, key = raw_path.lstrip(b"/").partition(b"/")
    for part, code, what in ((bucket, "InvalidBucketName", "bucket name"),
                             (key, "InvalidObjectName", "object key")):
        try:
            unquote_to_bytes(part).decode("utf-8")
        except UnicodeDecodeError:
            raise CloudError(code, f"The {what} in the request path is not valid UTF-8 once "
                             "percent-decoded.", 400) from None


class OssApi:
    def __init__(self, service: CloudService, accounts: list[Account], config: SimConfig):
        self.service = service
        self.by_key = {a.access_key_id: a for a in accounts}
        self.config = config

    def _error(self, err: CloudError, request_id: str, bucket: str = "") -> Response:
        body = {"Code": err.code, "Message": err.message, "RequestId": request_id,
                "HostId": PRODUCT.host}
        if bucket:
            body["BucketName"] = bucket
        return Response(_doc("Error", body), err.status, media_type="application/xml",
                        headers={"x-oss-request-id": request_id})

    def _authenticate(self, request: Request, resource: str) -> tuple[Account, str]:
        headers = {k.lower(): v for k, v in request.headers.items()}
        authorization = headers.get("authorization", "")
        m = re.fullmatch(r"OSS ([^:\s]+):(\S+)", authorization)
        if not m:
            raise CloudError("AccessDenied", "Authorization header is invalid: OSS signature "
                             "version 1 (OSS AccessKeyId:Signature) is required.", 403)
        account = self.by_key.get(m[1])
        if account is None:
            raise CloudError("InvalidAccessKeyId",
                             "The OSS Access Key Id you provided does not exist in our records.", 403)
        date = headers.get("x-oss-date") or headers.get("date", "")
        try:
            sent = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):   # OverflowError: 20-digit year
            raise CloudError("AccessDenied", "Missing or invalid Date header.", 403) from None
        if abs(timeutil.now_s() - sent) > self.config.max_clock_skew_s:
            raise CloudError("RequestTimeTooSkewed", "The difference between the request time "
                             "and the current time is too large.", 403)
        expected = sign(account.access_key_secret,
                        string_to_sign(request.method, headers, resource))
        if not same_secret(m[2], expected):
            raise CloudError("SignatureDoesNotMatch", "The request signature we calculated does "
                             "not match the signature you provided. Check your key and signing "
                             "method.", 403)
        return account, m[1]

    async def handle(self, request: Request) -> Response:
        request_id = ids.request_id().replace("-", "")[:24]
        bucket = request.path_params.get("bucket", "")
        try:
            check_path(request.scope.get("raw_path"))
        except CloudError as err:
            return self._error(err, request_id)     # the name would carry U+FFFD
        try:
            query = parse_query(request.scope.get("query_string", b""))
        except CloudError as err:
            return self._error(err, request_id, bucket)
        key = request.path_params.get("key", "")
        if key and not request.headers.get("authorization", "").startswith("OSS "):
            # /a/b without an OSS signature is no object request (the console's paths are
            # routed before this one): what any unknown path gets.
            return Response("Not Found", 404, media_type="text/plain")
        sub = sorted(k for k in query if k in _SUBRESOURCES)
        sub_string = ("?" + "&".join(f"{k}={query[k]}" if query[k] else k for k in sub)) if sub else ""
        resource = f"/{bucket}/{key}{sub_string}" if bucket else f"/{sub_string}"
        try:
            account, access_key_id = self._authenticate(request, resource)
            if key or (bucket and (request.method, tuple(sub)) in (("GET", ()),
                                                                   ("POST", ("delete",)))):
                return await self._object_call(request, account, bucket, key, query,
                                               request_id)
            action, params = self._route(request, bucket, query, sub)
            if request.method == "PUT" and action == "PutBucket":
                body = await request.body()
                if len(body) > 64 * 1024:
                    raise CloudError("InvalidArgument", "The request body is too large.", 400)
                storage = re.search(rb"<StorageClass>([^<]{0,32})</StorageClass>", body)
                if storage:
                    params["StorageClass"] = storage[1].decode("utf-8", "replace")
            caller = Caller(account=account, access_key_id=access_key_id,
                            source_ip=request.client.host if request.client else "",
                            user_agent=request.headers.get("user-agent", "")[:512])
            result = self.service.invoke(PRODUCT, action, params, caller, request_id)
        except CloudError as err:
            return self._error(err, request_id, bucket)
        return self._render(action, result, account, request_id)

    def _route(self, request: Request, bucket: str, query: dict[str, str], sub: list[str]
               ) -> tuple[str, dict[str, str]]:
        method = request.method
        if not bucket:
            if method == "GET":
                return "ListBuckets", {k: query[k] for k in ("prefix", "marker", "max-keys")
                                       if k in query}
            raise CloudError("MethodNotAllowed", "The specified method is not allowed against "
                             "this resource.", 405)
        params = {"BucketName": bucket}
        acl = request.headers.get("x-oss-acl")
        routes = {("PUT", ()): "PutBucket", ("PUT", ("acl",)): "PutBucketAcl",
                  ("GET", ("acl",)): "GetBucketAcl", ("GET", ("bucketInfo",)): "GetBucketInfo",
                  ("DELETE", ()): "DeleteBucket"}
        action = routes.get((method, tuple(sub)))
        if action is None:
            raise CloudError("NotImplemented", "The local cloud supports bucket create, list, "
                             "ACL, info and delete; objects and other sub-resources are not "
                             "implemented.", 400)
        if acl is not None:
            params["Acl"] = acl
        return action, params

    def _render(self, action: str, result: dict[str, Any], account: Account,
                request_id: str) -> Response:
        headers = {"x-oss-request-id": request_id}
        owner = {"ID": account.account_id, "DisplayName": account.account_id}
        if action == "ListBuckets":
            buckets = "".join(_xml("Bucket", {
                "CreationDate": b["CreationDate"], "ExtranetEndpoint": f"{b['Location']}.aliyuncs.com",
                "IntranetEndpoint": f"{b['Location']}-internal.aliyuncs.com",
                "Location": b["Location"], "Name": b["Name"], "Region": b["Region"],
                "StorageClass": b["StorageClass"]}) for b in result["Buckets"])
            extra = "".join(_xml(k, result[k]) for k in ("Prefix", "Marker", "MaxKeys",
                                                          "IsTruncated", "NextMarker"))
            text = ('<?xml version="1.0" encoding="UTF-8"?>\n<ListAllMyBucketsResult>'
                    f"{extra}{_xml('Owner', owner)}<Buckets>{buckets}</Buckets>"
                    "</ListAllMyBucketsResult>")
            return Response(text, 200, media_type="application/xml", headers=headers)
        if action == "GetBucketAcl":
            text = _doc("AccessControlPolicy", {"Owner": owner,
                                                "AccessControlList": {"Grant": result["Acl"]}})
            return Response(text, 200, media_type="application/xml", headers=headers)
        if action == "GetBucketInfo":
            b = result["Bucket"]
            text = _doc("BucketInfo", {"Bucket": {
                "CreationDate": b["CreationDate"], "ExtranetEndpoint": f"{b['Location']}.aliyuncs.com",
                "IntranetEndpoint": f"{b['Location']}-internal.aliyuncs.com",
                "Location": b["Location"], "Name": b["Name"], "Region": b["Region"],
                "StorageClass": b["StorageClass"], "Owner": owner,
                "AccessControlList": {"Grant": b["Acl"]}}})
            return Response(text, 200, media_type="application/xml", headers=headers)
        status = 204 if action == "DeleteBucket" else 200
        return Response(b"", status, headers=headers)

    # ---- objects (data events: not audited) -----------------------------------------------
    def _own_bucket(self, account: Account, name: str) -> None:
        if not _BUCKET_RE.fullmatch(name):
            raise CloudError("InvalidBucketName", "The specified bucket is not valid.", 400)
        store = self.service.store
        if store.get(account.account_id, BUCKET, name) is None:
            if store.owner_of_name(BUCKET, name) is not None:
                raise CloudError("AccessDenied", "You have no right to access this bucket.", 403)
            raise CloudError("NoSuchBucket", "The specified bucket does not exist.", 404)

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > OBJECT_MAX_BYTES:
            raise CloudError("EntityTooLarge", f"Your proposed upload exceeds the maximum "
                             f"allowed size ({OBJECT_MAX_BYTES} bytes here).", 400)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > OBJECT_MAX_BYTES:
                raise CloudError("EntityTooLarge", f"Your proposed upload exceeds the maximum "
                                 f"allowed size ({OBJECT_MAX_BYTES} bytes here).", 400)
            chunks.append(chunk)
        body = b"".join(chunks)
        md5 = request.headers.get("content-md5")
        if md5 is not None and md5 != base64.b64encode(hashlib.md5(body).digest()).decode():
            raise CloudError("InvalidDigest", "The Content-MD5 you specified is not valid.", 400)
        return body

    async def _object_call(self, request: Request, account: Account, bucket: str, key: str,
                           query: dict[str, str], request_id: str) -> Response:
        self._own_bucket(account, bucket)
        store, method = self.service.store, request.method
        headers = {"x-oss-request-id": request_id}
        if not key and method == "GET":
            return self._list_objects(bucket, query, headers)
        if not key:
            return self._delete_objects(bucket, await self._body(request), query, headers)
        if len(key.encode()) > OBJECT_KEY_MAX_BYTES or key.startswith(("/", "\\")):
            raise CloudError("InvalidObjectName", "The specified object name is not valid: 1 "
                             f"to {OBJECT_KEY_MAX_BYTES} bytes of UTF-8, not starting with / "
                             "or \\.", 400)
        if method == "PUT":
            body = await self._body(request)
            etag = hashlib.md5(body).hexdigest().upper()
            store.put_object(bucket, key, body, request.headers.get(
                "content-type", "application/octet-stream")[:256], etag, timeutil.now_ms())
            return Response(b"", 200, headers={**headers, "ETag": f'"{etag}"'})
        if method == "DELETE":
            store.delete_object(bucket, key)
            return Response(b"", 204, headers=headers)
        if method not in ("GET", "HEAD"):
            raise CloudError("MethodNotAllowed", "The specified method is not allowed against "
                             "this resource.", 405)
        found = store.get_object(bucket, key)
        if found is None:
            raise CloudError("NoSuchKey", "The specified key does not exist.", 404)
        data, content_type, etag, modified_ms = found
        headers.update({"ETag": f'"{etag}"', "Last-Modified": _http_date(modified_ms),
                        "x-oss-object-type": "Normal", "x-oss-storage-class": "Standard"})
        if method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return Response(b"", 200, media_type=content_type, headers=headers)
        return Response(data, 200, media_type=content_type, headers=headers)

    def _list_objects(self, bucket: str, query: dict[str, str],
                      headers: dict[str, str]) -> Response:
        prefix, marker = query.get("prefix", ""), query.get("marker", "")
        delimiter = query.get("delimiter", "")
        raw_max = query.get("max-keys", "100") or "100"
        if not raw_max.isdigit() or not 1 <= int(raw_max) <= 1000:
            raise CloudError("InvalidArgument", "max-keys must be an integer from 1 to 1000.",
                             400)
        max_keys, url = int(raw_max), query.get("encoding-type") == "url"
        contents: list[tuple[str, int, str, int]] = []
        prefixes: list[str] = []
        after, truncated, last = marker, False, ""
        store = self.service.store
        while not truncated:
            rows = store.list_objects(bucket, prefix, after, 1000)
            if not rows:
                break
            for row in rows:
                name = row[0]
                cut = name.find(delimiter, len(prefix)) if delimiter else -1
                if len(contents) + len(prefixes) == max_keys:
                    truncated = True
                    break
                if cut >= 0:
                    common = name[:cut + len(delimiter)]
                    prefixes.append(common)
                    last = after = common + "\U0010ffff"   # past every key under it
                    break
                contents.append(row)
                last = after = name
            else:
                if len(rows) < 1000:
                    break
        enc = (lambda t: quote(t, safe="")) if url else (lambda t: t)
        items = "".join(_xml("Contents", {
            "Key": enc(k), "LastModified": iso(ms).replace("Z", ".000Z"), "ETag": f'"{etag}"',
            "Type": "Normal", "Size": size, "StorageClass": "Standard"})
            for k, size, etag, ms in contents)
        items += "".join(_xml("CommonPrefixes", {"Prefix": enc(c)}) for c in prefixes)
        head = {"Name": bucket, "Prefix": enc(prefix), "Marker": enc(marker),
                "MaxKeys": max_keys, "Delimiter": enc(delimiter), "IsTruncated": truncated}
        if truncated:
            head["NextMarker"] = enc(last.removesuffix("\U0010ffff"))
        if url:
            head["EncodingType"] = "url"
        text = ('<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult>'
                + "".join(_xml(k, v) for k, v in head.items()) + items + "</ListBucketResult>")
        return Response(text, 200, media_type="application/xml", headers=headers)

    def _delete_objects(self, bucket: str, body: bytes, query: dict[str, str],
                        headers: dict[str, str]) -> Response:
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            raise CloudError("MalformedXML", "The XML you provided was not well-formed.",
                             400) from None
        keys = [k.text or "" for k in root.iter("Key")]
        if not keys or len(keys) > DELETE_MAX_KEYS:
            raise CloudError("MalformedXML", f"Delete 1 to {DELETE_MAX_KEYS} keys a request.",
                             400)
        url = query.get("encoding-type") == "url"
        if url:
            keys = [unquote(k) for k in keys]
        for key in keys:
            self.service.store.delete_object(bucket, key)
        quiet = (root.findtext("Quiet") or "false").strip().lower() == "true"
        enc = (lambda t: quote(t, safe="")) if url else (lambda t: t)
        deleted = "" if quiet else "".join(_xml("Deleted", {"Key": enc(k)}) for k in keys)
        text = ('<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult>'
                + (_xml("EncodingType", "url") if url else "") + deleted + "</DeleteResult>")
        return Response(text, 200, media_type="application/xml", headers=headers)


def _http_date(ms: int) -> str:
    return formatdate(ms / 1000, usegmt=True)
